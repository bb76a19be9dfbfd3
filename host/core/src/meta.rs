//! SessionMeta, composed above the kernel and its peers, and the reactions keel's feature
//! owners register with the kernel.
//!
//! A session's meta is its configuration (the kernel's), its task state and what it has
//! loaded (turn preparation's), its runtime (the kernel's) and the checkpoint its context
//! starts after (compaction's): each owner reads its own part; this module puts them together.

use crate::sql::Connection;
use serde::Serialize;

use crate::compaction::CurrentCheckpoint;
use crate::ids::SessionId;
use crate::preparation::{LoadedCapabilities, TaskState};
use crate::session::{self, MetaCounters, Runtime, SessionConfig, SessionEngine};
use crate::store::StoreError;

/// SessionMeta: the session's facts besides its history, as four sub-owners that each own
/// their columns and are read on their own: its configuration ([`SessionConfig`], fixed at
/// creation), its task state ([`TaskState`]: goals, phase, plan), what it has loaded
/// ([`LoadedCapabilities`]: tools, pins, skills, recalled memories) and its runtime
/// ([`Runtime`]: state, counters, active turn), with the checkpoint its context starts after.
/// Its JSON is the four flattened into one object, with the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionMeta {
    pub id: crate::ids::SessionId,
    #[serde(flatten)]
    pub config: SessionConfig,
    #[serde(flatten)]
    pub task: TaskState,
    #[serde(flatten)]
    pub capabilities: LoadedCapabilities,
    #[serde(flatten)]
    pub runtime: Runtime,
    /// The checkpoint the session's context starts after (its summary is in every request),
    /// if the session was compacted.
    pub checkpoint: Option<CurrentCheckpoint>,
}

impl SessionMeta {
    /// Session `id`'s meta, in one read.
    pub async fn read(engine: &SessionEngine, id: &SessionId) -> Result<Self, StoreError> {
        let id = id.clone();
        engine.db().read_inline(move |c| load_in(c, &id)).await
    }

    /// This meta (read at its `meta_version`) brought up to `counters`.
    pub fn apply(&mut self, counters: MetaCounters) {
        self.runtime = counters.runtime();
    }
}

/// Session `id`'s meta, read inside the caller's transaction.
pub(crate) fn load_in(c: &Connection, id: &str) -> Result<SessionMeta, StoreError> {
    let counters = session::load_counters(c, id)?;
    load_at(c, id, counters)
}

/// The meta of `id` whose state and counters (read in the same transaction) are `counters`:
/// reads what `meta_version` covers and fills in the rest.
pub fn load_at(
    c: &Connection,
    id: &str,
    counters: MetaCounters,
) -> Result<SessionMeta, StoreError> {
    // Every owner's reads go to the server at once (one round trip on PostgreSQL).
    session::prefetch_config_in(c, id)?;
    crate::preparation::task::prefetch_task_in(c, id)?;
    crate::preparation::prefetch_loaded_in(c, id)?;
    crate::compaction::prefetch_current_in(c, id)?;
    Ok(SessionMeta {
        id: id.into(),
        config: session::config_in(c, id)?,
        task: crate::preparation::task::task_in(c, id)?,
        capabilities: crate::preparation::loaded_in(c, id)?,
        runtime: counters.runtime(),
        checkpoint: crate::compaction::current_in(c, id)?,
    })
}

/// The call-done reaction: applies the changes control call `call_id` asked for, in the
/// transaction that records its result, by the owner of each fact: plan changes (once per call), skills and tools to load (add-only, so writing the
/// result again adds nothing), facts to remember by the user's memory (once per call), spawns,
/// sends, interrupts and questions by the workgroup.
pub(crate) fn on_call_done(
    c: &Connection,
    id: &str,
    call_id: &str,
    requests: &[crate::control::ControlRequest],
) -> Result<(), StoreError> {
    use crate::control::ControlRequest;
    use crate::preparation::capabilities::{Selection, Via, add_in};
    let plan: Vec<crate::plan::PlanRequest> = requests
        .iter()
        .filter_map(|r| match r {
            ControlRequest::Plan(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    if !plan.is_empty() {
        let task = crate::preparation::task::task_in(c, id)?;
        let phase = task.phase_turn.map(|turn| (turn, task.phase_goal.is_some()));
        crate::preparation::plan::apply_in(c, id, call_id, &plan, phase)?;
    }
    let turn = session::load_counters(c, id)?.active_turn();
    for r in requests {
        match r {
            ControlRequest::Plan(_) => {}
            ControlRequest::LoadSkill { name } => {
                let s = Selection { skills: vec![name.clone()], ..Selection::default() };
                add_in(c, id, &s, Via::SkillsLoad, turn, Some(call_id))?;
            }
            ControlRequest::SelectTools { tools, toolsets } => {
                let s = Selection {
                    tools: tools.clone(),
                    toolsets: toolsets.clone(),
                    ..Selection::default()
                };
                add_in(c, id, &s, Via::ToolsSelect, turn, Some(call_id))?;
            }
            ControlRequest::Remember { text, tags } => {
                let user = session::config_in(c, id)?.user();
                match crate::memory::add_in(c, &user, text, tags, Some((id, call_id))) {
                    Err(StoreError::Input(why)) => {
                        tracing::warn!(
                            session = id,
                            call = call_id,
                            "a memory was not kept: {why}"
                        );
                    }
                    other => {
                        other?;
                    }
                }
            }
            ControlRequest::Spawn(spawn) => crate::workgroup::spawn_in(c, id, call_id, spawn)?,
            ControlRequest::Send { session, input } => {
                crate::workgroup::send_in(c, id, call_id, session, input)?;
            }
            ControlRequest::Interrupt { session } => {
                crate::workgroup::stop_in(c, session, None)?;
            }
            ControlRequest::Ask { question } => {
                crate::workgroup::ask_in(c, id, call_id, question)?;
            }
        }
    }
    Ok(())
}
