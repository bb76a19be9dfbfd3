//! Wiring of the owner spine for one keel home: the store's writer, SessionEngine,
//! ToolService, AgentService and Brain. Front-ends (CLI, tests, benchmarks) start here.

use std::sync::Arc;

use crate::agent::{AgentService, LoopGuards};
use crate::brain::Brain;
use crate::config::{ConfigError, Setting, env, env_parsed};
use crate::home::Home;
use crate::model::{ModelClient, ModelConfig};
use crate::sandbox::SandboxLimits;
use crate::session::SessionEngine;
use crate::store::Db;
use crate::tools::{ToolService, ToolServiceError};
use crate::understand::PreprocessConfig;

/// The default system prompt of a session.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are keel, an agent that completes the user's task with the tools provided. \
Use tools to inspect and change files; never claim a change you did not make. \
Verify results with a tool before declaring the task done. Answer concisely.";

/// The reactions keel's feature owners register with the kernel: turn preparation's to a
/// creation and a turn's beginning, the workgroup's to a state change, the call-done one
/// (`meta`), compaction's to a recovery, and every feature's to a deletion: wiring, so it
/// lives with the harness, above every owner it names.
pub const REACTIONS: crate::session::Reactions = crate::session::Reactions {
    on_create: crate::preparation::on_create,
    on_turn_begun: crate::preparation::on_turn_begun,
    on_state: crate::workgroup::on_state,
    on_call_done: crate::meta::on_call_done,
    on_recover: crate::compaction::on_recover,
    on_delete,
    on_fork,
};

/// The delete reaction: the workgroup first (it refuses a session whose results another
/// session's history holds), then each feature's rows.
fn on_delete(c: &crate::sql::Connection, id: &str) -> Result<(), crate::store::StoreError> {
    crate::workgroup::on_delete(c, id)?;
    crate::preparation::on_delete(c, id)?;
    crate::compaction::on_delete(c, id)?;
    crate::assembly::on_delete(c, id)
}


/// The fork reaction: the workgroup first (it refuses a session of a workgroup), then each
/// feature copies its rows.
fn on_fork(
    c: &crate::sql::Connection,
    from: &str,
    to: &str,
    cut: &crate::session::HistoryCut,
) -> Result<(), crate::store::StoreError> {
    crate::workgroup::on_fork(c, from, to, cut)?;
    crate::preparation::on_fork(c, from, to, cut)?;
    crate::compaction::on_fork(c, from, to, cut)?;
    crate::assembly::on_fork(c, from, to, cut)
}

/// The owners of one home, wired together. They are private: a front-end reaches them only
/// through the use cases ([`crate::api`]), each with its caller.
#[derive(Clone)]
pub struct Harness {
    pub(crate) tools: Arc<ToolService>,
    pub(crate) engine: SessionEngine,
    pub(crate) brain: Brain,
    pub(crate) db: Db,
    /// What startup recovery found: sessions whose runner was gone and that changed or have
    /// work to resume.
    pub(crate) recovered: Vec<crate::session::RecoveredSession>,
    /// The text models are writing in this home's sessions, shared with other processes.
    pub(crate) live: crate::live::Live,
    /// The file changes of pending approvals, each computed once per state of its file.
    pub(crate) changes: Arc<crate::change::Changes>,
}

/// The owners behind the use cases, for the tests and benchmarks that check an owner's own
/// behaviour (a runner lease, a journal row, the catalog's cache). Only with the `internals`
/// feature, which no front-end's build enables.
#[cfg(feature = "internals")]
pub struct Internals<'a> {
    pub tools: &'a Arc<ToolService>,
    pub engine: &'a SessionEngine,
    pub brain: &'a Brain,
    pub db: &'a Db,
}

#[cfg(feature = "internals")]
impl Harness {
    /// The owners behind the use cases (tests and benchmarks only).
    pub fn internals(&self) -> Internals<'_> {
        Internals { tools: &self.tools, engine: &self.engine, brain: &self.brain, db: &self.db }
    }
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
    #[error(transparent)]
    Config(#[from] ConfigError),
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
        let live = crate::live::Live::at(home.root());
        let location = crate::config::store_location(&home)?;
        let tools = Arc::new(ToolService::open(home, limits, progress).await?);
        let db = Db::open_at(&location)?;
        let engine = SessionEngine::new(db.clone(), REACTIONS);
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
        Ok(Self { tools, engine, brain, db, recovered, live, changes: Arc::default() })
    }
}

/// Model settings given on the command line; each overrides its environment variable, which
/// overrides `keel.toml`.
#[derive(Debug, Clone, Default)]
pub struct ModelFlags {
    /// `--model-url` (`KEEL_MODEL_URL`, `[model] base_url`).
    pub url: Option<String>,
    /// `--model` (`KEEL_MODEL`, `[model] model`).
    pub model: Option<String>,
    /// `--temperature` (`KEEL_TEMPERATURE`, `[model] temperature`).
    pub temperature: Option<f64>,
    /// `--max-tokens` (`KEEL_MAX_TOKENS`, `[model] max_tokens`).
    pub max_tokens: Option<u32>,
    /// `--model-timeout` (`KEEL_MODEL_TIMEOUT`, `[model] timeout_ms`).
    pub timeout: Option<std::time::Duration>,
    /// `--context-window` (`KEEL_CONTEXT_WINDOW`, `[model] context_window`).
    pub context_window: Option<u64>,
    /// `--compact-at` (`KEEL_COMPACT_AT`, `[model] compact_at`).
    pub compact_at: Option<f64>,
}

/// Model settings from `HOME/keel.toml` (`[model]` table: base_url, model, temperature,
/// max_tokens, timeout_ms, stream, stream_usage, max_retries, context_window, compact_at,
/// notes_message),
/// overridden by the environment (`KEEL_MODEL_URL`, `KEEL_MODEL`, `KEEL_TEMPERATURE`,
/// `KEEL_MAX_TOKENS`, `KEEL_MODEL_TIMEOUT`, `KEEL_CONTEXT_WINDOW`, `KEEL_COMPACT_AT`),
/// overridden by `flags`. `None` when no base URL or model name is
/// known; an error names the setting that cannot work.
pub fn model_config(home: &Home, flags: &ModelFlags) -> Result<Option<ModelConfig>, ConfigError> {
    Ok(model_settings(home, flags)?.0)
}

/// [`model_config`], with each setting's value and where it came from (a flag, a variable,
/// `keel.toml`, the default): what `keel config` prints. The one reading of the model's
/// settings, so what it says is what a session gets.
pub fn model_settings(
    home: &Home,
    flags: &ModelFlags,
) -> Result<(Option<ModelConfig>, Vec<Setting>), ConfigError> {
    let p = crate::config::read(home)?.model.unwrap_or_default();
    let mut out = Vec::new();
    let file = |key: &str| format!("keel.toml [model] {key}");
    let url = pick(
        &mut out,
        "model.base_url",
        [
            ("--model-url".into(), flags.url.clone()),
            ("KEEL_MODEL_URL".into(), env("KEEL_MODEL_URL")),
            (file("base_url"), p.base_url),
        ],
        None,
    );
    let model = pick(
        &mut out,
        "model.model",
        [
            ("--model".into(), flags.model.clone()),
            ("KEEL_MODEL".into(), env("KEEL_MODEL")),
            (file("model"), p.model),
        ],
        None,
    );
    let (Some(url), Some(model)) = (url, model) else { return Ok((None, out)) };
    let mut cfg = ModelConfig::new(&url, &model);
    let number = |v: &str| v.parse::<f64>().map_err(|_| format!("`{v}` is not a number"));
    let tokens =
        |v: &str| v.parse::<u32>().map_err(|_| format!("`{v}` is not a whole number of tokens"));
    let window =
        |v: &str| v.parse::<u64>().map_err(|_| format!("`{v}` is not a whole number of tokens"));
    cfg.temperature = pick(
        &mut out,
        "model.temperature",
        [
            ("--temperature".into(), flags.temperature),
            ("KEEL_TEMPERATURE".into(), env_parsed("KEEL_TEMPERATURE", number)?),
            (file("temperature"), p.temperature),
        ],
        None,
    );
    cfg.max_tokens = pick(
        &mut out,
        "model.max_tokens",
        [
            ("--max-tokens".into(), flags.max_tokens),
            ("KEEL_MAX_TOKENS".into(), env_parsed("KEEL_MAX_TOKENS", tokens)?),
            (file("max_tokens"), p.max_tokens),
        ],
        None,
    );
    let ms = |t: std::time::Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
    cfg.timeout_ms = pick(
        &mut out,
        "model.timeout_ms",
        [
            ("--model-timeout".into(), flags.timeout.map(ms)),
            (
                "KEEL_MODEL_TIMEOUT".into(),
                env_parsed("KEEL_MODEL_TIMEOUT", crate::units::parse_duration)?.map(ms),
            ),
            (file("timeout_ms"), p.timeout_ms),
        ],
        Some(cfg.timeout_ms),
    )
    .unwrap_or(cfg.timeout_ms);
    cfg.stream =
        pick(&mut out, "model.stream", [(file("stream"), p.stream)], Some(cfg.stream)).unwrap_or(true);
    cfg.stream_usage = pick(
        &mut out,
        "model.stream_usage",
        [(file("stream_usage"), p.stream_usage)],
        Some(cfg.stream_usage),
    )
    .unwrap_or(true);
    cfg.max_retries = pick(
        &mut out,
        "model.max_retries",
        [(file("max_retries"), p.max_retries)],
        Some(cfg.max_retries),
    )
    .unwrap_or(cfg.max_retries);
    cfg.notes_message = pick(
        &mut out,
        "model.notes_message",
        [(file("notes_message"), p.notes_message)],
        Some(cfg.notes_message),
    )
    .unwrap_or(true);
    cfg.context_window = pick(
        &mut out,
        "model.context_window",
        [
            ("--context-window".into(), flags.context_window),
            ("KEEL_CONTEXT_WINDOW".into(), env_parsed("KEEL_CONTEXT_WINDOW", window)?),
            (file("context_window"), p.context_window),
        ],
        None,
    );
    cfg.compact_at = pick(
        &mut out,
        "model.compact_at",
        [
            ("--compact-at".into(), flags.compact_at),
            ("KEEL_COMPACT_AT".into(), env_parsed("KEEL_COMPACT_AT", number)?),
            (file("compact_at"), p.compact_at),
        ],
        Some(cfg.compact_at),
    )
    .unwrap_or(cfg.compact_at);
    cfg.validate()?;
    Ok((Some(cfg), out))
}

/// The first of `layers` (highest precedence first, each named by where it comes from) that
/// has a value, else `default`; recorded in `out` as `key`'s setting (a key with neither is
/// recorded as unset).
fn pick<T: ToString, const N: usize>(
    out: &mut Vec<Setting>,
    key: &str,
    layers: [(String, Option<T>); N],
    default: Option<T>,
) -> Option<T> {
    let found = layers.into_iter().find_map(|(from, v)| v.map(|v| (from, v)));
    let (from, value) = match (found, default) {
        (Some((from, v)), _) => (from, Some(v)),
        (None, Some(d)) => ("default".to_string(), Some(d)),
        (None, None) => ("unset".to_string(), None),
    };
    out.push(Setting {
        key: key.to_string(),
        value: value.as_ref().map(ToString::to_string),
        from,
    });
    value
}

/// The task-understanding settings of a new session whose business model is `business`:
/// `None` when `off` (`--no-preprocess`) or `[model.preprocess] enabled = false`; otherwise
/// the business model's server and model, not streamed, with a small reply and a short wait
/// ([`PreprocessConfig::from_business`]), changed by `[model.preprocess]` (base_url, model,
/// max_tokens, timeout_ms, response_format), the model overridden by `KEEL_PREPROCESS_MODEL`,
/// overridden by `model` (`--preprocess-model`).
pub fn preprocess_config(
    home: &Home,
    business: &ModelConfig,
    model: Option<&str>,
    off: bool,
) -> Result<Option<PreprocessConfig>, ConfigError> {
    let table = crate::config::read(home)?.model.and_then(|m| m.preprocess).unwrap_or_default();
    if off || table.enabled == Some(false) {
        return Ok(None);
    }
    let mut config = PreprocessConfig::from_business(business);
    if let Some(url) = table.base_url {
        config.model.base_url = url;
    }
    if let Some(m) =
        model.map(str::to_string).or_else(|| env("KEEL_PREPROCESS_MODEL")).or(table.model)
    {
        config.model.model = m;
    }
    if let Some(t) = table.max_tokens {
        config.model.max_tokens = Some(t);
    }
    if let Some(t) = table.timeout_ms {
        config.model.timeout_ms = t;
    }
    if let Some(f) = table.response_format {
        config.response_format = f.parse().map_err(|e: String| {
            ConfigError::from(format!("[model.preprocess] response_format: {e}"))
        })?;
    }
    config.model.validate()?;
    Ok(Some(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_window_and_threshold_come_from_the_file_and_flags_override_them() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path()).unwrap();
        std::fs::write(
            crate::config::path(&home),
            "[model]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\ncontext_window = 4096\ncompact_at = 0.7\n",
        )
        .unwrap();
        let cfg = model_config(&home, &ModelFlags::default()).unwrap().unwrap();
        assert_eq!((cfg.context_window, cfg.compact_at), (Some(4096), 0.7));
        let flags = ModelFlags {
            context_window: Some(8192),
            compact_at: Some(0.5),
            ..ModelFlags::default()
        };
        let cfg = model_config(&home, &flags).unwrap().unwrap();
        assert_eq!((cfg.context_window, cfg.compact_at), (Some(8192), 0.5));
        for (flags, says) in [
            (
                ModelFlags { compact_at: Some(0.0), ..ModelFlags::default() },
                "compact_at is a fraction",
            ),
            (
                ModelFlags { compact_at: Some(1.5), ..ModelFlags::default() },
                "compact_at is a fraction",
            ),
            (
                ModelFlags { context_window: Some(100), ..ModelFlags::default() },
                "at least 512 tokens",
            ),
        ] {
            let e = model_config(&home, &flags).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        // A session stored before compaction existed reads with the defaults.
        let old: ModelConfig = serde_json::from_str(
            r#"{"base_url":"http://x/v1","model":"m","timeout_ms":1,"stream":true,"max_retries":0}"#,
        )
        .unwrap();
        assert_eq!((old.context_window, old.compact_at), (None, crate::model::DEFAULT_COMPACT_AT));
    }
}
