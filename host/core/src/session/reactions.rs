//! Reactions: what the feature owners beside the kernel do inside the kernel's own commits.
//!
//! The kernel imports no feature. Where a commit of the kernel must change a feature's facts
//! in the same transaction — a session is created (how each of its tools arrived), a turn
//! begins (its transition, when no understanding call is to be made), a sub-session's turn
//! ends (its workgroup writes the terminal event), a control call's result is recorded (the
//! plan, the loaded capabilities, the memory and the workgroup apply what it asked for), a
//! stopped session is recovered (a compaction it left is settled), a session is deleted or
//! forked (each copies or deletes its own rows) — the kernel calls the
//! reaction the features registered. They are
//! code, the same for every database of the process: `install` keeps the first set given,
//! and every [`SessionEngine`](super::SessionEngine) is made with them, so no engine runs
//! without them.

use std::sync::OnceLock;

use crate::sql::Connection;
use crate::store::StoreError;

use super::state::RuntimeState;

/// A change of a session's runtime state, as its reaction sees it.
#[derive(Debug, Clone, Copy)]
pub struct StateChange<'a> {
    pub state: RuntimeState,
    pub detail: Option<&'a str>,
    /// The change ends the turn that was in progress (the session became idle, failed or was
    /// interrupted with a turn open).
    pub ends_turn: bool,
}

/// The reactions the feature owners register (each runs inside the caller's transaction).
#[derive(Debug, Clone, Copy)]
pub struct Reactions {
    /// Session `id` was created as `new`, in the creating transaction.
    pub on_create: fn(&Connection, &str, &super::NewSession) -> Result<(), StoreError>,
    /// Turn `turn` of session `id` began; `understand`: its runner makes the understanding
    /// call next (without it, the turn's transition is the preparation's to commit now).
    pub on_turn_begun: fn(&Connection, &str, i64, bool) -> Result<(), StoreError>,
    /// Session `id`'s runtime state changed.
    pub on_state: fn(&Connection, &str, StateChange<'_>) -> Result<(), StoreError>,
    /// Control call `call` of session `id` finished with these requests (never empty).
    pub on_call_done:
        fn(&Connection, &str, &str, &[crate::control::ControlRequest]) -> Result<(), StoreError>,
    /// Session `id` is being recovered after its runner stopped, before the kernel looks at
    /// its turn.
    pub on_recover: fn(&Connection, &str) -> Result<(), StoreError>,
    /// Session `id` is being deleted: each feature deletes its rows of it, or refuses.
    pub on_delete: fn(&Connection, &str) -> Result<(), StoreError>,
    /// Session `to` is being made as the fork of session `from` at the cut (the kernel's rows
    /// are written): each feature copies its rows of `from` up to the cut, or refuses.
    pub on_fork: fn(&Connection, &str, &str, &super::HistoryCut) -> Result<(), StoreError>,
}

impl Reactions {
    /// Reactions that do nothing: what a process has before any engine was made.
    pub const NONE: Self = Self {
        on_create: |_, _, _| Ok(()),
        on_turn_begun: |_, _, _, _| Ok(()),
        on_state: |_, _, _| Ok(()),
        on_call_done: |_, _, _, _| Ok(()),
        on_recover: |_, _| Ok(()),
        on_delete: |_, _| Ok(()),
        on_fork: |_, _, _, _| Ok(()),
    };
}

static INSTALLED: OnceLock<Reactions> = OnceLock::new();

/// Makes `reactions` the process's (the first set given stays: they are the same code).
pub(crate) fn install(reactions: Reactions) {
    let _ = INSTALLED.get_or_init(|| reactions);
}

/// The process's reactions.
pub(crate) fn get() -> &'static Reactions {
    INSTALLED.get().unwrap_or(&Reactions::NONE)
}
