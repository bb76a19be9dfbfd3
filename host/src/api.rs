//! The use cases of keel, on [`Harness`]: what a front-end (the CLI today; an HTTP API, an
//! MCP server and parent sessions next) asks of the owner spine — create or continue a
//! session, submit input, decide an approval and resume, interrupt, read what happened. Each
//! checks its input the same way for every front-end and fails with an [`ApiError`] whose
//! [`kind`](ApiError::kind) is stable, so a front-end maps errors to exit codes or HTTP
//! statuses without reading their text.

use crate::agent::{AgentError, Events, LoopGuards};
use crate::brain::Submitted;
use crate::harness::Harness;
use crate::model::ModelConfig;
use crate::sandbox::{Budget, CancelToken, Grant};
use crate::session::{ApprovalUnit, DecideError, Decision, NewSession, Policy};
use crate::store::StoreError;

/// What a new session is made of.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// Chosen id (letters, digits, `-`, `_`), or a generated one.
    pub id: Option<String>,
    /// Directories the session's tools may reach; fixed at creation.
    pub grants: Vec<Grant>,
    /// The tools the model sees; `None`: every installed tool.
    pub tools: Option<Vec<String>>,
    /// Policy adjustments by tool name or effect class, applied to the default policy.
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
    pub budget: Budget,
    pub model: ModelConfig,
    pub system_prompt: String,
    pub guards: LoopGuards,
}

/// Why a use case was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The input cannot be used (an empty message, say).
    #[error("{0}")]
    Input(String),
    /// The grants cannot work (overlapping guest paths, or grants for an existing session).
    #[error("{0}")]
    Grant(String),
    /// A named tool is not installed.
    #[error("{0}")]
    NotInstalled(String),
    /// The model settings cannot work.
    #[error("{0}")]
    Config(String),
    /// A decision on an approval unit was refused.
    #[error(transparent)]
    Decision(#[from] DecideError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The turn could not run.
    #[error(transparent)]
    Run(#[from] AgentError),
}

impl ApiError {
    /// A stable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Input(_) => "input",
            Self::Grant(_) => "grant",
            Self::NotInstalled(_) => "not_installed",
            Self::Config(_) => "config",
            // The decision's own kind: `not_found`, `wrong_session` or `not_pending`.
            Self::Decision(e) => e.kind(),
            Self::Store(_) => "store",
            Self::Run(_) => "run",
        }
    }
}

impl Harness {
    /// Creates a session: checks its grants, tools and model settings, stores it with its
    /// policy, budget and loop guards, and pins the component version of each loaded tool.
    /// Returns its id.
    pub async fn create_session(&self, spec: SessionSpec) -> Result<String, ApiError> {
        spec.model.validate().map_err(ApiError::Config)?;
        Grant::check_disjoint(&spec.grants).map_err(|e| ApiError::Grant(e.to_string()))?;
        let tools = match spec.tools {
            None => self
                .tools
                .tools()
                .map_err(|e| ApiError::Store(StoreError::Invalid(e.to_string())))?
                .into_iter()
                .map(|t| t.name)
                .collect(),
            Some(tools) => {
                for t in &tools {
                    self.tools.resolve(t).map_err(|e| ApiError::NotInstalled(e.to_string()))?;
                }
                tools
            }
        };
        let mut policy = Policy::default();
        policy.adjust(&spec.allow, &spec.ask, &spec.deny);
        let id = self
            .engine
            .create(NewSession {
                id: spec.id,
                grants: spec.grants,
                tools,
                policy,
                budget: spec.budget,
                model: spec.model,
                system_prompt: spec.system_prompt,
                guards: Some(spec.guards),
            })
            .await?;
        self.pin_loaded_tools(&id).await?;
        Ok(id)
    }

    /// Adds `tools` to an existing session (add-only), pinned at the versions installed now.
    pub async fn add_session_tools(&self, id: &str, tools: &[String]) -> Result<(), ApiError> {
        for t in tools {
            self.tools.resolve(t).map_err(|e| ApiError::NotInstalled(e.to_string()))?;
        }
        self.engine.add_tools(id, tools.to_vec()).await?;
        self.pin_loaded_tools(id).await
    }

    /// Pins the loaded tools of `id` that have no pin yet to the versions installed now.
    async fn pin_loaded_tools(&self, id: &str) -> Result<(), ApiError> {
        let meta = self.engine.meta(id).await?;
        let pins = self
            .tools
            .current_pins(&meta.loaded_tools)
            .map_err(|e| ApiError::Store(StoreError::Invalid(e.to_string())))?;
        self.engine.pin_tools(id, pins, false).await?;
        Ok(())
    }

    /// Submits `text` to session `id` and runs its turns (or queues the input when another
    /// runner holds the session). An empty input is refused before anything is stored.
    pub async fn send(
        &self,
        id: &str,
        text: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Submitted, ApiError> {
        if text.trim().is_empty() {
            return Err(ApiError::Input("the message is empty: say what to do".into()));
        }
        self.engine.meta(id).await?;
        Ok(self.brain.submit(id, text, cancel, events).await?)
    }

    /// Records a decision on approval unit `unit` (of session `session`, when given).
    pub async fn decide(
        &self,
        unit: &str,
        decision: Decision,
        reason: Option<String>,
        session: Option<String>,
    ) -> Result<ApprovalUnit, ApiError> {
        Ok(self.brain.decide(unit, decision, reason, session).await??)
    }

    /// Resumes session `id` (after a decision, or a recovery): runs its open turn and queued
    /// inputs. `None` when another live runner holds it (that runner resumes it).
    pub async fn resume(
        &self,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<Submitted>, ApiError> {
        Ok(self.brain.drain(id, cancel, events).await?)
    }
}
