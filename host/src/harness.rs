//! Wiring of the owner spine for one keel home: the store's writer, SessionEngine,
//! ToolService, AgentService and Brain. Front-ends (CLI, tests, benchmarks) start here.

use std::sync::Arc;

use crate::agent::{AgentService, LoopGuards};
use crate::brain::Brain;
use crate::home::Home;
use crate::model::{ModelClient, ModelConfig};
use crate::sandbox::SandboxLimits;
use crate::session::SessionEngine;
use crate::store::{Db, StoreError};
use crate::tools::{ToolService, ToolServiceError};

/// The default system prompt of a session.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are keel, an agent that completes the user's task with the tools provided. \
Use tools to inspect and change files; never claim a change you did not make. \
Verify results with a tool before declaring the task done. Answer concisely.";

/// The owners of one home, wired together.
#[derive(Clone)]
pub struct Harness {
    pub tools: Arc<ToolService>,
    pub engine: SessionEngine,
    pub brain: Brain,
    pub db: Db,
    /// What startup recovery found: sessions whose runner was gone and that changed or have
    /// work to resume.
    pub recovered: Vec<crate::session::RecoveredSession>,
}

/// Why the harness could not start.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(transparent)]
    Tools(#[from] ToolServiceError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
}

impl Harness {
    /// Opens the home's tools and store and wires the spine.
    pub async fn open(
        home: Home,
        limits: SandboxLimits,
        api_key: Option<String>,
        guards: LoopGuards,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Self, HarnessError> {
        let db_path = home.database();
        let sync = crate::config::synchronous(&home).map_err(StoreError::Invalid)?;
        let tools = Arc::new(ToolService::open(home, limits, progress).await?);
        let db = Db::open_with(&db_path, sync)?;
        let engine = SessionEngine::new(db.clone());
        let agent =
            AgentService::new(engine.clone(), tools.clone(), ModelClient::new(api_key)?, guards);
        let brain = Brain::new(db.clone(), agent);
        let recovered = brain.recover().await?;
        let changed: Vec<_> = recovered
            .iter()
            .filter(|r| r.state_before != r.state_after || !r.outcome_unknown.is_empty())
            .collect();
        if !changed.is_empty() {
            let unknown: usize = changed.iter().map(|r| r.outcome_unknown.len()).sum();
            progress(&format!(
                "recovered {} session(s) after an unclean stop ({unknown} call outcome(s) unknown); `keel recover` resumes them",
                changed.len()
            ));
        }
        Ok(Self { tools, engine, brain, db, recovered })
    }
}

/// Model settings from `HOME/keel.toml` (`[model]` table: base_url, model, temperature,
/// max_tokens, timeout_ms, stream, max_retries), overridden by `KEEL_MODEL_URL` / `KEEL_MODEL`,
/// overridden by the given flags. `None` when no base URL or model name is known.
pub fn model_config(
    home: &Home,
    url_flag: Option<&str>,
    model_flag: Option<&str>,
) -> Result<Option<ModelConfig>, String> {
    let p = crate::config::read(home)?.model.unwrap_or_default();
    let env = crate::config::env;
    let url = url_flag.map(str::to_string).or_else(|| env("KEEL_MODEL_URL")).or(p.base_url);
    let model = model_flag.map(str::to_string).or_else(|| env("KEEL_MODEL")).or(p.model);
    let (Some(url), Some(model)) = (url, model) else { return Ok(None) };
    let mut cfg = ModelConfig::new(&url, &model);
    cfg.temperature = p.temperature;
    cfg.max_tokens = p.max_tokens;
    if let Some(t) = p.timeout_ms {
        cfg.timeout_ms = t;
    }
    if let Some(s) = p.stream {
        cfg.stream = s;
    }
    if let Some(r) = p.max_retries {
        cfg.max_retries = r;
    }
    cfg.validate()?;
    Ok(Some(cfg))
}
