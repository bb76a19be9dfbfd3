//! AgentService: the fixed model/tool loop of one turn.
//!
//! assemble (SessionEngine) → model → tools (ToolService) → commit (SessionEngine) → repeat,
//! with loop guards (steps per turn, the same call repeated, consecutive tool errors), each
//! ending the turn with a notice instead of spinning. Read-only calls of one response run in
//! parallel (bounded); side-effecting calls run one at a time, their intents committed before
//! they run; results commit in the model's order. Owns nothing that must survive a request:
//! every fact it produces is committed through SessionEngine.

mod calls;
pub mod compact;
pub mod summary;

use crate::assembly::Assembly;
use crate::meta::SessionMeta;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::assembly::CallFacts;
use crate::cancel::CancelToken;
use crate::model::{ModelClient, ModelError, Usage};
pub use crate::session::LoopGuards;
use crate::session::{RuntimeState, SessionEngine, StepCommit, TurnStart};
use crate::store::StoreError;
use crate::tools::ToolService;

use crate::ids::{CallId, SessionId, UnitId};
use calls::StepEnd;
pub use calls::{DirectCall, };

/// Something worth telling the user while a turn runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    State(RuntimeState),
    ModelCall {
        step: i64,
    },
    /// The model's reply to step `step` is in.
    ModelReplied {
        step: i64,
        /// Why the reply ended, as the server said: `length` means it was cut by the token
        /// limit.
        finish_reason: Option<String>,
        usage: Option<Usage>,
        ms: f64,
        /// Whether the reply holds neither text nor tool calls.
        empty: bool,
    },
    ToolStarted {
        name: String,
        call_id: CallId,
    },
    ToolFinished {
        name: String,
        call_id: CallId,
        ok: bool,
        kind: Option<crate::failure::FailureKind>,
        ms: f64,
    },
    /// A call waits for a person's decision (`keel approvals`).
    ApprovalNeeded {
        unit: UnitId,
        tool: String,
    },
    /// A piece of the model's text for step `step`, as it arrives (transient: the durable
    /// message is written when the reply is in).
    TextDelta {
        step: i64,
        text: String,
    },
    /// The attempt that streamed step `step`'s text so far failed and the call is made again:
    /// the text shown is void and starts over.
    TextRestarted {
        step: i64,
    },
}

/// Whether an error body speaks of system messages or roles, as chat templates that refuse a
/// second system message do ("System message must be at the beginning", "Conversation roles
/// must alternate", "System role not supported").
fn refuses_roles(body: &str) -> bool {
    let body = body.to_ascii_lowercase();
    body.contains("system") || body.contains("role")
}

/// A sink for [`Event`]s.
pub type Events = Arc<dyn Fn(&Event) + Send + Sync>;

/// A step whose calls have all ended, to be checked against the loop guards and committed.
struct StepDone {
    /// The request of a fresh step (its evidence commits with it); `None` for an open step.
    assembled: Option<crate::assembly::Assembled>,
    step_no: i64,
    result: calls::StepResult,
    /// The step's number within this turn (0 for a step finished from the journal).
    in_turn: u32,
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnOutcome {
    /// The model gave its final answer.
    Answer(String),
    /// A loop guard stopped the turn with this notice: in the history, or in the state's
    /// detail when no step could carry it.
    Stopped(String),
    /// The user interrupted the turn.
    Interrupted,
    /// The turn waits for these approval units; the runner has exited.
    WaitingApproval(Vec<UnitId>),
    /// The model could not be reached or answered nonsense; nothing of the step was committed.
    Failed(String),
}

impl TurnOutcome {
    /// How the turn ended, as a name: `answer`, `stopped`, `interrupted`, `waiting_approval`,
    /// `failed` (the metrics' and the trace's label).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Answer(_) => "answer",
            Self::Stopped(_) => "stopped",
            Self::Interrupted => "interrupted",
            Self::WaitingApproval(_) => "waiting_approval",
            Self::Failed(_) => "failed",
        }
    }

    /// How the turn ended, in words: `answered`, `waiting for approval ap-…` …
    pub fn describe(&self) -> String {
        match self {
            Self::Answer(_) => "answered".to_string(),
            Self::Stopped(note) => format!("stopped: {note}"),
            Self::Interrupted => "interrupted".to_string(),
            Self::WaitingApproval(units) => format!(
                "waiting for approval {}",
                units.iter().map(|u| u.as_str()).collect::<Vec<_>>().join(", ")
            ),
            Self::Failed(e) => format!("failed: {e}"),
        }
    }
}

/// Why a turn could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tools(#[from] crate::tools::ToolServiceError),
}

/// Loop-guard counters of one turn.
#[derive(Default)]
struct GuardState {
    repeats: HashMap<String, u32>,
    consecutive_errors: u32,
    /// The runner lease the turn's last commit releases (when no input waits).
    lease: Option<Arc<str>>,
    /// Why a compaction of this turn failed, if one did: the turn does not try again (two
    /// summary calls per step would add up) unless a request passes the window itself.
    compaction_failed: Option<String>,
}

/// The AgentService.
#[derive(Clone)]
pub struct AgentService {
    engine: SessionEngine,
    tools: Arc<ToolService>,
    model: ModelClient,
    guards: LoopGuards,
}

impl AgentService {
    pub fn new(
        engine: SessionEngine,
        tools: Arc<ToolService>,
        model: ModelClient,
        guards: LoopGuards,
    ) -> Self {
        Self { engine, tools, model, guards: guards.normalized() }
    }

    pub fn engine(&self) -> &SessionEngine {
        &self.engine
    }

    /// The model client (Brain's understanding call uses it too).
    pub fn model(&self) -> &ModelClient {
        &self.model
    }

    /// Runs one turn of session `id` until it ends or waits for an approval. A turn that was
    /// already under way (it waited for an approval, or its process died) is resumed: its open
    /// step is finished from the journal first.
    ///
    /// The turn runs under the session's stored loop guards, or this service's when the
    /// session has none.
    #[tracing::instrument(
        name = "turn",
        skip_all,
        fields(
            session_id = %id,
            turn = turn.turn,
            keel.outcome = tracing::field::Empty,
        )
    )]
    pub async fn run_turn(
        &self,
        id: &SessionId,
        turn: &TurnStart,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<TurnOutcome, AgentError> {
        let started = std::time::Instant::now();
        let outset = self.engine.outset(id).await?;
        let out = match outset.config.guards.clone().map(LoopGuards::normalized) {
            Some(g) if g != self.guards => {
                Self { guards: g, ..self.clone() }
                    .run_turn_guarded(id, turn, outset, cancel, events)
                    .await
            }
            _ => self.run_turn_guarded(id, turn, outset, cancel, events).await,
        };
        let outcome = match &out {
            Ok(o) => o.kind(),
            Err(_) => "error",
        };
        tracing::Span::current().record("keel.outcome", outcome);
        crate::metrics::TURNS.inc(&[outcome]);
        crate::metrics::TURN_SECONDS.observe(&[], started.elapsed().as_secs_f64());
        out
    }

    async fn run_turn_guarded(
        &self,
        id: &SessionId,
        turn: &TurnStart,
        outset: crate::session::TurnOutset,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<TurnOutcome, AgentError> {
        let mut guard = GuardState { lease: turn.lease.clone(), ..GuardState::default() };
        if let Some(open) = outset.open_step {
            let meta = SessionMeta::read(&self.engine, id).await?;
            if !calls::can_progress(&meta, &open) {
                let pending = open
                    .units
                    .iter()
                    .filter(|u| u.status == crate::session::ApprovalStatus::Pending)
                    .map(|u| u.id.clone());
                return Ok(TurnOutcome::WaitingApproval(pending.collect()));
            }
            if meta.runtime.state != RuntimeState::Running {
                self.engine.set_state(id, RuntimeState::Running, None).await?;
            }
            events(&Event::State(RuntimeState::Running));
            let step_no = open.step;
            match calls::run_open(self, &meta, open, cancel, events).await? {
                StepEnd::Waiting(units) => return Ok(self.waiting(units, events)),
                StepEnd::Done(step) => {
                    if let Some(end) = self
                        .finish_step(
                            id,
                            turn.turn,
                            StepDone { assembled: None, step_no, result: step, in_turn: 0 },
                            &mut guard,
                            cancel,
                            events,
                        )
                        .await?
                    {
                        return Ok(end);
                    }
                }
            }
        } else if turn.resumed {
            // A turn taken over from a runner that stopped: its next model call is announced
            // again, with the `running` state.
            self.engine.resume_turn(id, turn.turn, crate::session::Again::ModelCall).await?;
            events(&Event::State(RuntimeState::Running));
        } else {
            // begin_turn committed `running`; a resumed turn shows it again now.
            if outset.runtime.state != RuntimeState::Running {
                self.engine.set_state(id, RuntimeState::Running, None).await?;
            }
            events(&Event::State(RuntimeState::Running));
        }
        for step_in_turn in 1..=self.guards.max_steps {
            if cancel.is_cancelled() {
                return self.interrupted(id, events).await;
            }
            // A request the server refuses as too long is compacted and sent again, once; one
            // refused while it held a second system message is sent again with one.
            let mut overflowed = false;
            let mut relaid = false;
            let (meta, mut assembled, catalog, result, called) = loop {
                let (meta, assembled, catalog) =
                    match self.assemble_fitting(id, &mut guard, cancel).await? {
                        Ok(a) => a,
                        Err(end) => {
                            events(&Event::State(RuntimeState::Failed));
                            return Ok(end);
                        }
                    };
                events(&Event::ModelCall { step: assembled.step });
                let called = Instant::now();
                let step = assembled.step;
                let on_text = |piece: crate::model::Streamed<'_>| match piece {
                    crate::model::Streamed::Text(text) => {
                        events(&Event::TextDelta { step, text: text.to_string() });
                    }
                    crate::model::Streamed::Restart => events(&Event::TextRestarted { step }),
                };
                let result = self
                    .model
                    .complete_with(&meta.config.model, &assembled.body, cancel, Some(&on_text))
                    .instrument(tracing::info_span!("model_call", step = assembled.step))
                    .await;
                if !overflowed
                    && let Err(f) = &result
                    && let ModelError::ContextTooLong { body, .. } = &f.last
                {
                    overflowed = true;
                    let bytes = assembled.body.len() as i64;
                    // The window the refusal names, else less than the refused request.
                    let per_token = Assembly::of(&self.engine).bytes_per_token(id).await?;
                    let named = crate::model::window_in_refusal(body);
                    let window = named.unwrap_or_else(|| (bytes as f64 / per_token * 0.75) as u64);
                    // The window the server names — else the guess, below what it refused —
                    // is the session's from now on: every later request is sized to it, with
                    // room for the reply, and the next turn does not overflow to learn it again.
                    let learned = self.engine.learn_window(id, window).await?;
                    if learned {
                        tracing::info!(
                            window,
                            named = named.is_some(),
                            "the session keeps the context window the model server's refusal told"
                        );
                    }
                    let request = compact::CompactRequest {
                        trigger: compact::Trigger::Overflow,
                        window: Some(
                            meta.config.model.context_window.map_or(window, |w| w.min(window)),
                        ),
                        aim: compact::Aim {
                            keep_bytes: Some(bytes / 4),
                            input_bytes: Some(bytes / 2),
                        },
                        before: None,
                        state_after: RuntimeState::Running,
                    };
                    // Sent again once compacted — or, sized to the window the server named,
                    // with its tool results cut to fit if compaction could not help.
                    if let compact::Compaction::Compacted { .. } =
                        self.compact(id, request, cancel).await?
                    {
                        continue;
                    }
                    if learned && named.is_some() {
                        continue;
                    }
                }
                if !relaid
                    && assembled.notes.is_some()
                    && let Err(f) = &result
                    && let ModelError::Status { status: 400 | 422 | 500, body, .. } = &f.last
                    && refuses_roles(body)
                {
                    relaid = true;
                    // Some chat templates accept one system message only, first: the session
                    // sends its notes inside it from now on.
                    if self.engine.learn_one_system_message(id).await? {
                        tracing::info!(
                            error = %f.last,
                            "the model server refused a second system message; the session sends one from now on"
                        );
                        continue;
                    }
                }
                break (meta, assembled, catalog, result, called);
            };
            assembled.call = CallFacts {
                turn: turn.turn,
                duration_ms: called.elapsed().as_secs_f64() * 1e3,
                ..CallFacts::default()
            };
            let reply = match result {
                Ok(r) => r,
                Err(f) if f.last == ModelError::Cancelled => {
                    return self.interrupted(id, events).await;
                }
                Err(f) => {
                    // The request is kept, with the status the server gave: a refused request
                    // can be looked at (`keel session evidence --refused`).
                    let detail = f.to_string();
                    assembled.call.attempts = f.attempts;
                    let seq = Assembly::of(&self.engine)
                        .refuse_step(id, assembled, f.last.http_status(), detail.clone())
                        .await?;
                    tracing::debug!(refused = seq, "model request failed; its evidence is kept");
                    events(&Event::State(RuntimeState::Failed));
                    return Ok(TurnOutcome::Failed(detail));
                }
            };
            assembled.call.finish_reason = reply.finish_reason.clone();
            assembled.call.usage = reply.usage;
            assembled.call.attempts = reply.attempts;
            assembled.call.empty = reply.tool_calls.is_empty()
                && reply.content.as_deref().is_none_or(|c| c.trim().is_empty());
            events(&Event::ModelReplied {
                step: assembled.step,
                finish_reason: reply.finish_reason.clone(),
                usage: reply.usage,
                ms: assembled.call.duration_ms,
                empty: assembled.call.empty,
            });
            if reply.tool_calls.is_empty() {
                let answer = reply.content.clone().unwrap_or_default();
                let assistant =
                    serde_json::json!({"role": "assistant", "content": answer}).to_string();
                Assembly::of(&self.engine)
                    .commit_step(
                        id,
                        Some(assembled.clone()),
                        StepCommit {
                            turn: turn.turn,
                            step: assembled.step,
                            assistant,
                            results: Vec::new(),
                            journal: Vec::new(),
                            notice: None,
                            state: RuntimeState::Idle,
                            detail: None,
                            closes_open_step: false,
                            release_lease: turn.lease.clone(),
                        },
                    )
                    .await?;
                events(&Event::State(RuntimeState::Idle));
                return Ok(TurnOutcome::Answer(answer));
            }
            let started = Instant::now();
            let at = calls::Step { agent: self, meta: &meta, step: assembled.step, cancel, events };
            let end =
                calls::run_fresh(at, catalog.as_deref(), turn.turn, &assembled, reply).await?;
            tracing::debug!(
                step = assembled.step,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "tool calls done"
            );
            match end {
                StepEnd::Waiting(units) => return Ok(self.waiting(units, events)),
                StepEnd::Done(step) => {
                    let step_no = assembled.step;
                    if let Some(end) = self
                        .finish_step(
                            id,
                            turn.turn,
                            StepDone {
                                assembled: Some(assembled),
                                step_no,
                                result: step,
                                in_turn: step_in_turn,
                            },
                            &mut guard,
                            cancel,
                            events,
                        )
                        .await?
                    {
                        return Ok(end);
                    }
                }
            }
        }
        // Not reached: the last step's `finish_step` ends the turn with the step-limit notice.
        // Were it reached, the turn would still end (idle, the notice as the state's detail)
        // rather than stay `running`.
        let notice = format!(
            "[keel] Turn stopped: it reached the limit of {} model calls per turn.",
            self.guards.max_steps
        );
        self.engine.set_state(id, RuntimeState::Idle, Some(notice.clone())).await?;
        Ok(TurnOutcome::Stopped(notice))
    }

    /// Assembles the session's next request — its catalog read in the assembly's own
    /// snapshot, so the request's tool schemas and the components its calls run come from one
    /// catalog version — so that it fits the session's context window with room for the
    /// reply ([`compact::request_limit`]):
    ///
    /// 1. past the session's threshold (or the limit, if lower) it compacts first
    ///    ([`compact::MAX_ROUNDS`] times at most);
    /// 2. a request still past the limit — the anchor and the step that just ran are never
    ///    compacted — has its history's tool results cut to the largest size that fits
    ///    (`fitting_cap`, in the session's assembly), the calls whole;
    /// 3. only a request that no cut can make fit ends the turn (`Err`), failed with a
    ///    message that says why, and kept as a request that was not sent (its announced model
    ///    call closed as failed).
    #[allow(clippy::type_complexity)]
    async fn assemble_fitting(
        &self,
        id: &SessionId,
        guard: &mut GuardState,
        cancel: &CancelToken,
    ) -> Result<
        Result<
            (
                crate::meta::SessionMeta,
                crate::assembly::Assembled,
                Option<Arc<crate::tools::Catalog>>,
            ),
            TurnOutcome,
        >,
        AgentError,
    > {
        let mut rounds = 0;
        // Set once compaction has done what it can: the request's size in bytes, and why
        // compaction could not make it fit.
        let mut within: Option<(usize, String)> = None;
        loop {
            let (meta, assembled, catalog) =
                self.assemble_with_catalog(id, within.as_ref().map(|w| w.0)).await?;
            let Some(window) = meta.config.model.context_window else {
                return Ok(Ok((meta, assembled, catalog)));
            };
            let per_token = Assembly::of(&self.engine).bytes_per_token(id).await?;
            let bytes = assembled.body.len() as i64;
            let tokens = (bytes as f64 / per_token).ceil() as i64;
            let limit = compact::request_limit(&meta.config.model, window);
            let ceiling = limit.min(window as f64 * meta.config.model.compact_at);
            if let Some((_, why)) = &within {
                if tokens as f64 <= limit {
                    if let Some(cap) = assembled.result_cap {
                        tracing::debug!(tokens, window, cap, %why, "tool results cut to fit");
                    }
                    return Ok(Ok((meta, assembled, catalog)));
                }
                let message = format!(
                    "the next request needs about {tokens} tokens, and the model's context window of {window} \
                     holds {} with room for the reply; compaction could not make it fit ({why}), and neither could \
                     cutting its tool results to {} bytes each: the call itself, the turn's message and keel's \
                     instructions and tool schemas are too large. Start a new session, or use a model with a \
                     larger context (--context-window)",
                    limit.floor() as i64,
                    crate::assembly::MIN_RESULT_CAP,
                );
                Assembly::of(&self.engine)
                    .refuse_step(id, assembled, None, format!("not sent: {message}"))
                    .await?;
                return Ok(Err(TurnOutcome::Failed(message)));
            }
            if (tokens as f64) < ceiling {
                return Ok(Ok((meta, assembled, catalog)));
            }
            let why = if rounds == compact::MAX_ROUNDS {
                format!("{rounds} compactions before this request did not make it small enough")
            } else if let Some(failed) =
                guard.compaction_failed.clone().filter(|_| tokens as f64 <= limit)
            {
                failed
            } else {
                rounds += 1;
                let request = compact::CompactRequest {
                    trigger: compact::Trigger::Threshold,
                    window: Some(window),
                    aim: compact::aim(window, ceiling, per_token, &assembled),
                    before: Some((bytes, tokens)),
                    state_after: RuntimeState::Running,
                };
                match self.compact(id, request, cancel).await? {
                    compact::Compaction::Compacted { .. } => continue,
                    compact::Compaction::Nothing => {
                        "nothing before the current step can be compacted".to_string()
                    }
                    compact::Compaction::Failed(e) | compact::Compaction::Discarded(e) => {
                        guard.compaction_failed = Some(e.clone());
                        e
                    }
                }
            };
            // The request goes as it is while it fits the window itself, with the reply's room.
            if tokens as f64 <= limit {
                tracing::debug!(tokens, window, %why, "request over the compaction threshold");
                return Ok(Ok((meta, assembled, catalog)));
            }
            within = Some(((limit * per_token) as usize, why));
        }
    }

    /// The session's next request, assembled with the tool schemas of the catalog read in
    /// the assembly's own snapshot (returned: a step's calls resolve against it); its tool
    /// results cut to `within` bytes if given and needed.
    #[allow(clippy::type_complexity)]
    async fn assemble_with_catalog(
        &self,
        id: &SessionId,
        within: Option<usize>,
    ) -> Result<
        (crate::meta::SessionMeta, crate::assembly::Assembled, Option<Arc<crate::tools::Catalog>>),
        AgentError,
    > {
        let mut catalog = None;
        let (meta, assembled) = Assembly::of(&self.engine)
            .assemble_within(id, within, |c, m, form| {
                let at = self.tools.catalog_in(c).ok()?;
                let (loaded, pins) = (&m.capabilities.loaded_tools, &m.capabilities.tool_pins);
                let json = at.tools_json_as(loaded, pins, form);
                catalog = Some(at);
                json
            })
            .await?;
        Ok((meta, assembled, catalog))
    }

    /// Where the room of session `id`'s next request goes: the request assembled as it would
    /// be sent now (before any compaction or cut), against the session's window.
    pub async fn room(&self, id: &SessionId) -> Result<crate::assembly::RoomView, AgentError> {
        let (meta, assembled, _) = self.assemble_with_catalog(id, None).await?;
        let bytes_per_token = Assembly::of(&self.engine).bytes_per_token(id).await?;
        let window = meta.config.model.context_window;
        Ok(crate::assembly::RoomView {
            window,
            limit: window.map(|w| compact::request_limit(&meta.config.model, w) as u64),
            bytes_per_token,
            bytes: assembled.body.len(),
            tokens: (assembled.body.len() as f64 / bytes_per_token).ceil() as u64,
            parts: assembled.room,
        })
    }

    fn waiting(&self, units: Vec<UnitId>, events: &Events) -> TurnOutcome {
        events(&Event::State(RuntimeState::WaitingApproval));
        TurnOutcome::WaitingApproval(units)
    }

    /// Applies the loop guards to a finished step and commits it; `Some` when the turn ends.
    async fn finish_step(
        &self,
        id: &SessionId,
        turn: i64,
        done: StepDone,
        guard: &mut GuardState,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<TurnOutcome>, AgentError> {
        let StepDone { assembled, step_no, result: step, in_turn: step_in_turn } = done;
        if step.all_failed {
            guard.consecutive_errors += step.calls as u32;
        } else {
            guard.consecutive_errors = 0;
        }
        // Identical calls within one reply are one repeat, not several.
        let distinct: std::collections::BTreeSet<&String> = step.signatures.iter().collect();
        for sig in distinct {
            *guard.repeats.entry(sig.clone()).or_insert(0) += 1;
        }
        guard.repeats.retain(|k, _| step.signatures.contains(k));
        let notice = if guard.repeats.values().any(|n| *n >= self.guards.max_repeats) {
            Some(format!(
                "[keel] Turn stopped: the same tool call was repeated {} times in a row without progress.",
                self.guards.max_repeats
            ))
        } else if guard.consecutive_errors >= self.guards.max_consecutive_errors {
            Some(format!(
                "[keel] Turn stopped: {} tool calls failed in a row. Check the errors above, then send a new instruction.",
                guard.consecutive_errors
            ))
        } else if step_in_turn == self.guards.max_steps {
            Some(format!(
                "[keel] Turn stopped: it reached the limit of {} model calls per turn. Send a message to continue.",
                self.guards.max_steps
            ))
        } else {
            None
        };
        let interrupted = cancel.is_cancelled();
        let state = if interrupted {
            RuntimeState::Interrupted
        } else if notice.is_some() {
            RuntimeState::Idle
        } else {
            RuntimeState::Running
        };
        Assembly::of(&self.engine)
            .commit_step(
                id,
                if step.opened { None } else { assembled },
                StepCommit {
                    turn,
                    step: step_no,
                    assistant: step.assistant,
                    results: step.results,
                    journal: step.journal,
                    notice: notice.clone(),
                    state,
                    detail: interrupted.then(|| "interrupted by the user".to_string()),
                    closes_open_step: step.opened,
                    release_lease: if state == RuntimeState::Idle {
                        guard.lease.clone()
                    } else {
                        None
                    },
                },
            )
            .await?;
        if step.wrote {
            crate::crash::point("after_result");
        }
        if interrupted {
            events(&Event::State(RuntimeState::Interrupted));
            return Ok(Some(TurnOutcome::Interrupted));
        }
        if let Some(n) = notice {
            events(&Event::State(RuntimeState::Idle));
            return Ok(Some(TurnOutcome::Stopped(n)));
        }
        Ok(None)
    }

    async fn interrupted(
        &self,
        id: &SessionId,
        events: &Events,
    ) -> Result<TurnOutcome, AgentError> {
        self.engine
            .set_state(id, RuntimeState::Interrupted, Some("interrupted by the user".into()))
            .await?;
        events(&Event::State(RuntimeState::Interrupted));
        Ok(TurnOutcome::Interrupted)
    }
}
