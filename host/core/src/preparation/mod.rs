//! Turn preparation: what a turn is for and what it may use, decided before its first model
//! request. The task state (goals, phase, plan versions: [`task`], [`plan`]), the transition a
//! turn's input makes of it ([`transition`]), the Orchestrator's capability preparation
//! ([`orchestration`]), what the session has loaded ([`capabilities`]) and the discovery
//! tools' view ([`discovery`]). Each file owns its tables; [`Preparation`] is their handle.

pub mod capabilities;
pub mod discovery;
pub mod orchestration;
pub mod plan;
pub mod task;
pub mod transition;

use crate::sql::{Connection, OptionalExtension, params};

use crate::ids::SessionId;
use crate::session::SessionEngine;
use crate::store::StoreError;

pub use capabilities::LoadedCapabilities;
pub(crate) use capabilities::on_create;
pub use discovery::SessionDiscovery;
pub use task::TaskState;

/// What turn preparation owns of the sessions of one engine: their task state (goals, phase,
/// plan), what they have loaded, their transitions and orchestrations.
#[derive(Clone, Copy)]
pub struct Preparation<'a> {
    engine: &'a SessionEngine,
}

impl<'a> Preparation<'a> {
    /// The handle of `engine`'s sessions.
    pub fn of(engine: &'a SessionEngine) -> Self {
        Self { engine }
    }

    /// The session's task state: goals, phase, plan.
    #[cfg(any(test, feature = "internals"))]
    pub async fn task(&self, id: &SessionId) -> Result<TaskState, StoreError> {
        let id = id.clone();
        self.engine.db().read_inline(move |c| task::task_in(c, &id)).await
    }

    /// What the session has loaded.
    pub async fn loaded(&self, id: &SessionId) -> Result<LoadedCapabilities, StoreError> {
        let id = id.clone();
        self.engine.db().read_inline(move |c| loaded_in(c, &id)).await
    }

    /// Pins loaded tools to component digests: `pins` holds the digest each tool resolves to
    /// now. Without `upgrade` only tools not pinned yet are pinned (what a session loaded it
    /// keeps); with it every given pin replaces the old one. Returns the pins that changed,
    /// as (tool, old digest, new digest).
    pub async fn pin_tools(
        &self,
        id: &SessionId,
        pins: std::collections::BTreeMap<String, String>,
        upgrade: bool,
    ) -> Result<Vec<(String, Option<String>, String)>, StoreError> {
        let id = id.clone();
        self.engine.write(id.clone(), move |c| capabilities::pin_in(c, &id, pins, upgrade)).await
    }

    /// Adds tools to the session's loaded set (add-only, pinned): an admin's addition through
    /// AddSelectedCapabilities.
    #[cfg(any(test, feature = "internals"))]
    pub async fn add_tools(&self, id: &SessionId, tools: Vec<String>) -> Result<(), StoreError> {
        let selection = capabilities::Selection { tools, ..Default::default() };
        self.add_capabilities(id, selection, capabilities::Via::Admin).await.map(|_| ())
    }

    /// The session's active turn when its transition is not committed yet (the runner makes
    /// the understanding call, then [`commit_transition`](Self::commit_transition)).
    pub async fn pending_understanding(
        &self,
        id: &SessionId,
    ) -> Result<Option<transition::PendingUnderstanding>, StoreError> {
        let id = id.clone();
        self.engine.db().read_inline(move |c| transition::pending_in(c, &id)).await
    }

    /// Commits turn `turn`'s transition (see `transition::commit_in`), with the recall of its
    /// capability preparation when it has one: `None` when it was committed already.
    pub async fn commit_transition(
        &self,
        id: &SessionId,
        turn: i64,
        understood: transition::Understood,
        recalled: Option<orchestration::RecallRecord>,
    ) -> Result<Option<transition::Transition>, StoreError> {
        let id = id.clone();
        self.engine
            .write(id.clone(), move |c| {
                transition::commit_in(c, &id, turn, &understood, recalled.as_ref())
            })
            .await
    }

    /// The active turn's transition when its capability preparation has not finished (see
    /// `transition::unprepared_in`).
    pub async fn unprepared(
        &self,
        id: &SessionId,
    ) -> Result<Option<transition::Transition>, StoreError> {
        let id = id.clone();
        self.engine.db().read_inline(move |c| transition::unprepared_in(c, &id)).await
    }

    /// Records what recall found (see `orchestration::record_recall_in`) and, with `finish`,
    /// finishes the orchestration in the same commit (no call was needed).
    pub async fn record_recall(
        &self,
        id: &SessionId,
        record: orchestration::RecallRecord,
        finish: Option<orchestration::OrchestratorCall>,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.engine
            .write(id.clone(), move |c| {
                orchestration::record_recall_in(c, &id, &record)?;
                if let Some(call) = &finish {
                    orchestration::finish_in(c, &id, record.turn, call)?;
                }
                Ok(())
            })
            .await
    }

    /// Finishes turn `turn`'s orchestration: adds what was selected and applies the
    /// environment (see `orchestration::finish_in`).
    pub async fn finish_orchestration(
        &self,
        id: &SessionId,
        turn: i64,
        call: orchestration::OrchestratorCall,
    ) -> Result<capabilities::Added, StoreError> {
        let id = id.clone();
        self.engine.write(id.clone(), move |c| orchestration::finish_in(c, &id, turn, &call)).await
    }

    /// AddSelectedCapabilities outside a turn (an admin's addition): add-only, pinned.
    pub async fn add_capabilities(
        &self,
        id: &SessionId,
        selection: capabilities::Selection,
        via: capabilities::Via,
    ) -> Result<capabilities::Added, StoreError> {
        let id = id.clone();
        self.engine
            .write(id.clone(), move |c| capabilities::add_in(c, &id, &selection, via, None, None))
            .await
    }

    /// Unloads a tool or skill from session `id` (the explicit removal path).
    pub async fn unload(
        &self,
        id: &SessionId,
        kind: capabilities::Kind,
        name: &str,
    ) -> Result<(), StoreError> {
        let (id, name) = (id.clone(), name.to_string());
        self.engine.write(id.clone(), move |c| capabilities::unload_in(c, &id, kind, &name)).await
    }

    /// The session's capabilities and how each arrived, and its orchestrations.
    pub async fn capabilities(
        &self,
        id: &SessionId,
    ) -> Result<(Vec<capabilities::Capability>, Vec<orchestration::Orchestration>), StoreError>
    {
        let id = id.clone();
        self.engine
            .db()
            .read(move |c| {
                crate::session::load_counters(c, &id)?;
                Ok((capabilities::of_session(c, &id)?, orchestration::orchestrations_in(c, &id)?))
            })
            .await
    }

    /// The exact request of turn `turn`'s orchestration call (the last one if `None`).
    pub async fn orchestration_evidence(
        &self,
        id: &SessionId,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.clone();
        self.engine.db().read(move |c| orchestration::evidence_in(c, &id, turn)).await
    }

    /// The session's task transitions, oldest first.
    #[cfg(any(test, feature = "internals"))]
    pub async fn transitions(
        &self,
        id: &SessionId,
    ) -> Result<Vec<transition::Transition>, StoreError> {
        let id = id.clone();
        self.engine
            .db()
            .read(move |c| {
                crate::session::load_counters(c, &id)?;
                transition::of_session(c, &id)
            })
            .await
    }

    /// The exact request body of turn `turn`'s understanding call (the last one if `None`).
    pub async fn understanding_evidence(
        &self,
        id: &SessionId,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.clone();
        self.engine.db().read(move |c| transition::evidence_in(c, &id, turn)).await
    }
}

/// Supporting calls whose exact requests are kept, by the table that records them.
#[derive(Debug, Clone, Copy)]
pub enum CallKind {
    Understanding,
    Orchestration,
}

impl CallKind {
    fn table(self) -> &'static str {
        match self {
            Self::Understanding => "task_transitions",
            Self::Orchestration => "orchestrations",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Understanding => "understanding",
            Self::Orchestration => "orchestration",
        }
    }
}

/// The exact request body of session `id`'s `kind` call of turn `turn` (the last turn that
/// made one if `None`), byte for byte.
pub(crate) fn call_evidence_in(
    c: &Connection,
    id: &str,
    kind: CallKind,
    turn: Option<i64>,
) -> Result<(i64, Vec<u8>), StoreError> {
    crate::session::load_counters(c, id)?;
    let sql = format!(
        "SELECT turn, body_sha256 FROM {} WHERE session_id=?1 AND (CAST(?2 AS BIGINT) IS NULL OR turn=?2)
         AND body_sha256 IS NOT NULL ORDER BY turn DESC LIMIT 1",
        kind.table()
    );
    let row: Option<(i64, String)> = c
        .prepare_cached(&sql)?
        .query_row(params![id, turn], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((turn, sha)) = row else {
        let what = kind.name();
        return Err(StoreError::NotFound(match turn {
            Some(t) => format!("turn {t} of session `{id}` made no {what} call"),
            None => format!("session `{id}` has made no {what} call"),
        }));
    };
    Ok((turn, crate::store::blobs::get_in(c, &sha)?.into_bytes()))
}

/// What session `id` has loaded: its tools and skills, with what the latest orchestration's
/// recall found.
/// Sends the reads of [`loaded_in`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_loaded_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    capabilities::prefetch_loaded_in(c, id)?;
    orchestration::prefetch_latest_in(c, id)
}

pub(crate) fn loaded_in(c: &Connection, id: &str) -> Result<LoadedCapabilities, StoreError> {
    let (loaded_tools, tool_pins) = capabilities::tools_in(c, id)?;
    let skills = capabilities::skills_in(c, id)?;
    let (found_skills, memories) = match orchestration::latest_in(c, id)? {
        Some(o) => (
            o.candidates
                .skills
                .into_iter()
                .filter(|s| !skills.iter().any(|l| l.name == s.name))
                .collect(),
            o.memories,
        ),
        None => (Vec::new(), Vec::new()),
    };
    Ok(LoadedCapabilities { loaded_tools, skills, found_skills, memories, tool_pins })
}

/// The turn reaction (see [`crate::session::reactions`]): a turn whose runner makes no
/// understanding call has its transition (the fixed table on no answer) committed as it begins.
pub(crate) fn on_turn_begun(
    c: &Connection,
    id: &str,
    turn: i64,
    understand: bool,
) -> Result<(), StoreError> {
    if understand {
        return Ok(());
    }
    transition::commit_in(c, id, turn, &transition::Understood::default(), None).map(|_| ())
}

/// The fork reaction: fork `to` gets `from`'s task transitions and orchestrations of the
/// turns up to the cut's, the plan versions and loaded capabilities that came before it (by
/// turn, and by a call the fork's journal holds), and the goals they left.
pub(crate) fn on_fork(
    c: &Connection,
    from: &str,
    to: &str,
    cut: &crate::session::HistoryCut,
) -> Result<(), StoreError> {
    let copies = [
        (
            "task_transitions",
            "turn, at_ms, relation, mode, session_goal, phase_goal, terms, error, body_sha256, \
             body_bytes, reply, duration_ms, attempts",
            "turn<=?3",
        ),
        (
            "orchestrations",
            "turn, at_ms, mode, candidates, memories, recall_error, recall_ms, body_sha256, \
             body_bytes, reply, selected, dropped, error, duration_ms, attempts, done",
            "turn<=?3",
        ),
        (
            "plan_versions",
            "version, phase_turn, at_ms, change, steps, closed, call_id",
            "phase_turn<=?3 AND (call_id IS NULL OR call_id IN
                 (SELECT call_id FROM tool_calls WHERE session_id=?2))",
        ),
        (
            "session_capabilities",
            "kind, name, via, turn, at_ms, digest, call_id",
            "(turn IS NULL OR turn<=?3) AND (call_id IS NULL OR call_id IN
                 (SELECT call_id FROM tool_calls WHERE session_id=?2))",
        ),
    ];
    for (table, columns, which) in copies {
        c.execute(
            &format!(
                "INSERT INTO {table} (session_id, {columns})
                 SELECT ?2, {columns} FROM {table} WHERE session_id=?1 AND {which}"
            ),
            params![from, to, cut.turn],
        )?;
    }
    let goals: Option<(Option<String>, Option<String>)> = c
        .prepare_cached(
            "SELECT session_goal, phase_goal FROM task_transitions WHERE session_id=?1
             ORDER BY turn DESC LIMIT 1",
        )?
        .query_row([to], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (session_goal, mut phase_goal) = goals.unwrap_or_default();
    let mut phase_turn: Option<i64> = c
        .prepare_cached(
            "SELECT MAX(turn) FROM task_transitions WHERE session_id=?1 AND mode<>'keep'",
        )?
        .query_row([to], |r| r.get(0))?;
    if let Some(turn) = phase_turn {
        let closed: Option<i64> = c
            .prepare_cached(
                "SELECT closed FROM plan_versions WHERE session_id=?1 AND phase_turn=?2
                 ORDER BY version DESC LIMIT 1",
            )?
            .query_row(params![to, turn], |r| r.get(0))
            .optional()?;
        if closed.is_some_and(|c| c != 0) {
            (phase_goal, phase_turn) = (None, None);
        }
    }
    c.prepare_cached(
        "UPDATE session_config SET session_goal=?2, phase_goal=?3, phase_turn=?4
         WHERE session_id=?1",
    )?
    .execute(params![to, session_goal, phase_goal, phase_turn])?;
    Ok(())
}

/// The delete reaction: the session's task transitions, plan versions, capabilities and
/// orchestrations.
pub(crate) fn on_delete(c: &Connection, id: &str) -> Result<(), StoreError> {
    for table in ["task_transitions", "plan_versions", "session_capabilities", "orchestrations"] {
        c.execute(&format!("DELETE FROM {table} WHERE session_id=?1"), [id])?;
    }
    Ok(())
}
