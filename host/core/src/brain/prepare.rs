//! Before a turn's first model call: task understanding (the stateless call, and the
//! transition it leads to, committed by SessionEngine) and capability preparation (recall of
//! skills, tools and memories in parallel, then the Orchestrator's call).

use super::*;
use crate::ids::SessionId;
use crate::meta::SessionMeta;
use crate::preparation::Preparation;

impl Brain {
    /// Task understanding of the session's active turn, when its transition is pending: the
    /// stateless call (if the session has it on), then the transition's commit, then
    /// capability preparation when the goals changed. A turn whose transition is committed
    /// already is left as it is: an input is understood and applied once. `resumed`: a runner
    /// takes the turn over from one that stopped (a call it makes again is announced again).
    /// Returns whether it announced the turn's next model call (the commit that ends the
    /// preparation does).
    #[tracing::instrument(name = "understand", skip_all, fields(session_id = %id))]
    pub(super) async fn understand(
        &self,
        id: &SessionId,
        cancel: &CancelToken,
        resumed: bool,
    ) -> Result<bool, AgentError> {
        let Some(pending) = Preparation::of(self.engine()).pending_understanding(id).await? else {
            // Committed already: its capability preparation may not have finished (the
            // process died in between).
            if let Some(t) = Preparation::of(self.engine()).unprepared(id).await?
                && let Some(config) = self.engine().config(id).await?.preprocess
            {
                self.prepare_capabilities(id, &t, &config, cancel).await?;
                return Ok(true);
            }
            return Ok(false);
        };
        let understood = match &pending.preprocess {
            None => Understood::default(),
            Some(config) => {
                if resumed {
                    self.engine().resume_turn(id, pending.turn, Again::Understanding).await?;
                }
                let understood = self.understanding_call(config, &pending, cancel).await;
                crate::crash::point("after_understanding_call");
                understood
            }
        };
        // The fixed table's mode is known before the commit: a transition that prepares
        // capabilities recalls first, so that the recall commits with the transition (and,
        // with nothing to choose from, the whole preparation does).
        let mode = understood.mode(pending.phase_goal.as_deref());
        let recalled = match &pending.preprocess {
            Some(_) if crate::preparation::transition::prepares_capabilities(mode, true) => {
                let meta = SessionMeta::read(self.engine(), id).await?;
                Some(self.recall(&meta, pending.turn, mode, &understood.terms()).await)
            }
            _ => None,
        };
        let committed = Preparation::of(self.engine())
            .commit_transition(id, pending.turn, understood, recalled.clone())
            .await?;
        let announced = committed.is_some();
        if let (Some(t), Some(r), Some(config)) = (committed, recalled, &pending.preprocess)
            && !r.candidates.is_empty()
        {
            crate::crash::point("after_recall");
            self.orchestrate(id, &t, config, &r.candidates, cancel).await?;
        }
        Ok(announced)
    }

    /// The understanding call: one stateless, non-streamed JSON request holding the message,
    /// its resources and the two goals; its answer read liberally. A failed call or an
    /// unreadable answer is `uncertain`, with the reason kept.
    async fn understanding_call(
        &self,
        config: &understand::PreprocessConfig,
        pending: &PendingUnderstanding,
        cancel: &CancelToken,
    ) -> Understood {
        let body = understand::request_body(
            config,
            understand::Inputs {
                message: &pending.text,
                resources: &[],
                current_task_goal: pending.phase_goal.as_deref(),
                session_goal: pending.session_goal.as_deref(),
            },
        );
        let body = bytes::Bytes::from(body);
        let started = Instant::now();
        let result = self.agent.model().complete(&config.model, &body, cancel).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        let (understanding, error, reply, attempts) = match result {
            Ok(reply) => {
                let content = reply.content.unwrap_or_default();
                match understand::parse(&content) {
                    Ok((u, reader)) => {
                        reader.log("task understanding");
                        (u, None, Some(content), reply.attempts)
                    }
                    Err(e) => (
                        understand::Understanding::uncertain(),
                        Some(format!("the answer was refused: {e}")),
                        Some(content),
                        reply.attempts,
                    ),
                }
            }
            Err(f) => {
                let why = match &f.last {
                    ModelError::Cancelled => "the call was interrupted".to_string(),
                    // Said once, by the turn's own call to the server, not twice.
                    ModelError::Unreachable { url, .. } => {
                        format!("nothing answers at {url}")
                    }
                    // The call's own limit, with its own setting (not the turn's).
                    ModelError::Timeout { waiting, limit_ms } => format!(
                        "the model server sent nothing for {} while keel waited for {waiting}; that is the \
                         task-understanding call's longest wait ([model.preprocess] timeout_ms in keel.toml, \
                         now {limit_ms} ms; at most the session's --model-timeout)",
                        crate::units::format_duration(std::time::Duration::from_millis(*limit_ms))
                    ),
                    _ => f.to_string(),
                };
                (understand::Understanding::uncertain(), Some(why), None, f.attempts)
            }
        };
        if let Some(e) = &error {
            tracing::debug!(error = %e, "task understanding is uncertain");
        }
        Understood {
            understanding: Some(understanding),
            error,
            request: Some(body.to_vec()),
            reply,
            duration_ms,
            attempts,
        }
    }

    /// Capability preparation for a transition that set the goals (`initialize` or
    /// `reconcile`): recall of the three groups — skills, tools, the user's memories — in
    /// parallel; the recall's commit; the Orchestrator's call when there are candidates to
    /// choose from; the commit that adds what it selected and applies the environment. A
    /// failed recall group or call leaves the environment as it was, with an event saying
    /// what failed, and the turn goes on.
    async fn prepare_capabilities(
        &self,
        id: &SessionId,
        transition: &Transition,
        config: &understand::PreprocessConfig,
        cancel: &CancelToken,
    ) -> Result<(), AgentError> {
        let meta = SessionMeta::read(self.engine(), id).await?;
        let record = self.recall(&meta, transition.turn, transition.mode, &transition.terms).await;
        if record.candidates.is_empty() {
            // Nothing to choose from: no call; the recall and the environment in one commit.
            let call = crate::preparation::orchestration::OrchestratorCall::default();
            Preparation::of(self.engine()).record_recall(id, record, Some(call)).await?;
            return Ok(());
        }
        let candidates = record.candidates.clone();
        Preparation::of(self.engine()).record_recall(id, record, None).await?;
        crate::crash::point("after_recall");
        self.orchestrate(id, transition, config, &candidates, cancel).await
    }

    /// The recall of one transition, timed, as it is recorded.
    async fn recall(
        &self,
        meta: &crate::meta::SessionMeta,
        turn: i64,
        mode: crate::understand::TransitionMode,
        terms: &crate::preparation::transition::RecallTerms,
    ) -> crate::preparation::orchestration::RecallRecord {
        let started = Instant::now();
        let recalled = recall(&self.db, meta, terms).await;
        crate::preparation::orchestration::RecallRecord {
            turn,
            mode: mode.as_str().to_string(),
            candidates: recalled.candidates,
            memories: recalled.memories,
            error: recalled.error,
            recall_ms: started.elapsed().as_secs_f64() * 1e3,
        }
    }

    /// The Orchestrator's call over recorded candidates, then the commit that adds what it
    /// selected and applies the environment.
    #[tracing::instrument(name = "orchestrate", skip_all, fields(session_id = %id))]
    async fn orchestrate(
        &self,
        id: &SessionId,
        transition: &Transition,
        config: &understand::PreprocessConfig,
        candidates: &crate::preparation::orchestration::Candidates,
        cancel: &CancelToken,
    ) -> Result<(), AgentError> {
        let meta = SessionMeta::read(self.engine(), id).await?;
        let call = self.orchestrator_call(config, &meta, transition, candidates, cancel).await;
        crate::crash::point("after_orchestration_call");
        Preparation::of(self.engine()).finish_orchestration(id, transition.turn, call).await?;
        Ok(())
    }

    /// The Orchestrator's call: one stateless, non-streamed JSON request; its answer read
    /// liberally and kept to the candidates. A failed call or an unreadable answer adds nothing.
    async fn orchestrator_call(
        &self,
        config: &understand::PreprocessConfig,
        meta: &crate::meta::SessionMeta,
        transition: &Transition,
        candidates: &crate::preparation::orchestration::Candidates,
        cancel: &CancelToken,
    ) -> crate::preparation::orchestration::OrchestratorCall {
        let skills: Vec<String> = meta.capabilities.skills.iter().map(|s| s.name.clone()).collect();
        let body = orchestrate::request_body(
            config,
            orchestrate::Inputs {
                mode: transition.mode.as_str(),
                session_goal: transition.session_goal.as_deref(),
                phase_goal: transition.phase_goal.as_deref(),
                terms: &transition.terms,
                loaded_tools: &meta.capabilities.loaded_tools,
                loaded_skills: &skills,
                candidates,
            },
        );
        let body = bytes::Bytes::from(body);
        let started = Instant::now();
        let result = self.agent.model().complete(&config.model, &body, cancel).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut call = crate::preparation::orchestration::OrchestratorCall {
            request: Some(body.to_vec()),
            duration_ms,
            ..Default::default()
        };
        match result {
            Ok(reply) => {
                call.attempts = reply.attempts;
                let content = reply.content.unwrap_or_default();
                match orchestrate::parse(&content) {
                    Ok((answer, reader)) => {
                        reader.log("orchestrator");
                        let (selection, dropped) = orchestrate::validate(answer, candidates);
                        if !dropped.is_empty() {
                            tracing::info!(session = %meta.id, ?dropped, "the orchestrator named what recall did not offer");
                        }
                        call.selection = selection;
                        call.dropped = dropped;
                    }
                    Err(e) => call.error = Some(format!("the answer was refused: {e}")),
                }
                call.reply = Some(content);
            }
            Err(f) => {
                call.attempts = f.attempts;
                call.error = Some(if f.last == ModelError::Cancelled {
                    "the call was interrupted".to_string()
                } else {
                    f.to_string()
                });
            }
        }
        call
    }
}

/// What recall found for one transition.
struct Recalled {
    candidates: crate::preparation::orchestration::Candidates,
    memories: Vec<crate::memory::Memory>,
    /// What failed, group by group.
    error: Option<String>,
}

/// Recalls the three groups — skills, tools (as tool sets and single tools), the session
/// user's memories — in parallel on the read pool. Scores truncate and order each group and
/// are logged; then what the session has loaded already is left out and each group is sorted
/// by stable reference, so neither scores nor completion order reach a request.
async fn recall(
    db: &Db,
    meta: &crate::meta::SessionMeta,
    terms: &crate::preparation::transition::RecallTerms,
) -> Recalled {
    use crate::search::MAX_CANDIDATES;
    let (skill_terms, tool_terms, memory_terms) =
        (terms.skill.clone(), terms.tool.clone(), terms.memory.clone());
    let user = meta.config.user();
    let (skills, tools, memories) = tokio::join!(
        db.read(move |c| crate::skills::recall_in(c, &skill_terms, MAX_CANDIDATES)),
        db.read(move |c| {
            let hits = crate::tools::recall_in(c, &tool_terms, MAX_CANDIDATES)?;
            let mut sets = Vec::new();
            for h in &hits {
                if !sets.iter().any(|s: &crate::tools::ToolSetRef| s.name == h.item.component)
                    && let Some(set) = crate::tools::toolset_in(c, &h.item.component)?
                {
                    sets.push(set);
                }
            }
            Ok((hits, sets))
        }),
        db.read(move |c| crate::memory::recall_in(
            c,
            &user,
            &memory_terms,
            crate::memory::RECALLED
        )),
    );
    let mut errors = Vec::new();
    let mut out = Recalled { candidates: Default::default(), memories: Vec::new(), error: None };
    match skills {
        Ok(hits) => {
            for h in &hits {
                tracing::debug!(session = %meta.id, skill = %h.item.name, score = h.score, "skill recalled");
            }
            out.candidates.skills = hits
                .into_iter()
                .map(|h| h.item)
                .filter(|s| !meta.capabilities.skills.iter().any(|l| l.name == s.name))
                .collect();
        }
        Err(e) => errors.push(format!("skills: {e}")),
    }
    match tools {
        Ok((hits, sets)) => {
            for h in &hits {
                tracing::debug!(session = %meta.id, tool = %h.item.name, score = h.score, "tool recalled");
            }
            let loaded = |t: &String| meta.capabilities.loaded_tools.contains(t);
            out.candidates.tools =
                hits.into_iter().map(|h| h.item).filter(|t| !loaded(&t.name)).collect();
            out.candidates.toolsets =
                sets.into_iter().filter(|s| !s.tools.iter().all(loaded)).collect();
        }
        Err(e) => errors.push(format!("tools: {e}")),
    }
    match memories {
        Ok(hits) => {
            for h in &hits {
                tracing::debug!(session = %meta.id, memory = h.item.id, score = h.score, "memory recalled");
            }
            out.memories = hits.into_iter().map(|h| h.item).collect();
        }
        Err(e) => errors.push(format!("memory: {e}")),
    }
    crate::search::by_reference(&mut out.candidates.skills, |s| s.name.clone());
    crate::search::by_reference(&mut out.candidates.tools, |t| t.name.clone());
    crate::search::by_reference(&mut out.candidates.toolsets, |t| t.name.clone());
    crate::search::by_reference(&mut out.memories, |m| m.id);
    if !errors.is_empty() {
        tracing::warn!(session = %meta.id, "recall failed in part: {}", errors.join("; "));
        out.error = Some(errors.join("; "));
    }
    out
}
