//! The use cases of keel, on [`Harness`]: what a front-end (the CLI today; an HTTP API, an
//! MCP server and parent sessions next) asks of the owner spine — create or continue a
//! session, submit input, decide an approval and resume, interrupt, read what happened. Each
//! checks its input the same way for every front-end and fails with an [`ApiError`] whose
//! [`kind`](ApiError::kind) is stable, so a front-end maps errors to exit codes or HTTP
//! statuses without reading their text.

use crate::assembly::Assembly;
use crate::preparation::Preparation;
use crate::views::Views;
use crate::workgroup::Workgroups;
use std::sync::Arc;
use std::time::Duration;

mod access;
mod callers;
mod capabilities;
mod files;
mod fork;
mod mcp;
mod registry;
mod running;
mod settings;
pub mod shown;
mod skills;
mod tools;
mod undo;
mod workgroups;
pub use crate::caller::Caller;
pub use crate::change::{Changes, FileChange, cut_lines};
pub use crate::undo::{Force as RewindForce, NotUndone, PathRewind};
pub use callers::{
    ApprovalView, BudgetRequest, GrantRequest, PolicyRequest, SessionRequest, WorkgroupRequest,
};
pub use capabilities::SessionCapabilities;
pub use files::{Attached, MAX_ATTACHED_BYTES};
pub use fork::{ForkOptions, ForkReport};
pub use mcp::McpRefresh;
pub use registry::{
    Outdated, OutdatedKind, PublishedSkill, RegistryAuth, RegistryInstall, SkillSigned,
};
pub use running::KeepRunning;
pub use settings::{KeptSession, PRUNED_BY_DEFAULT, Pruned, SessionFilter};
pub use skills::SkillInstallReport;
pub use tools::{is_control_tool, shown_class};
pub use undo::{ConversationReport, ReplayReport, ReplayedCall, RewindOptions, RewindReport};

use crate::agent::{AgentError, Events, LoopGuards};
use crate::assembly::ModelCallRecord;
use crate::assembly::RoomView;
use crate::brain::Submitted;
use crate::harness::Harness;
use crate::ids::SessionId;
use crate::model::ModelConfig;
use crate::sandbox::{Budget, CancelToken, Grant};
use crate::session::{
    ApprovalUnit, DecideError, EventRow, NewSession, Policy, RecoveredSession, RuntimeState,
};
use crate::store::StoreError;
use crate::tools::{
    CallOutcome, CallRequest, ComponentRecord, HostTool, InstallMode, InstallReport, ToolPins,
    ToolRecord,
};
use crate::views::Timeline;

/// A tool version change of [`Harness::upgrade_session_tools`]: the tool, the digest it ran
/// before (if pinned) and the digest it runs now.
pub type PinChange = (String, Option<String>, String);

/// The first-party control and discovery tools every new session is given.
pub const CONTROL_TOOLS: &[&str] = crate::builtin::ALWAYS_LOADED;
pub use crate::workgroup::DELEGATION_TOOLS;

/// What a new session is made of.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// Chosen id (letters, digits, `-`, `_`), or a generated one.
    pub id: Option<String>,
    /// Directories the session's tools may reach; fixed at creation.
    pub grants: Vec<Grant>,
    /// Network destinations the session's tools may send HTTP requests to, and the secrets
    /// bound to them; fixed at creation.
    pub net: crate::sandbox::net::NetGrants,
    /// The tools the model sees; `None`: every installed tool.
    pub tools: Option<Vec<String>>,
    /// Policy adjustments by tool name or effect class, applied to the default policy.
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
    /// Regular expressions whose matches in tool results are redacted before the model, the
    /// history, the journal or a summary sees them.
    pub redact: Vec<String>,
    pub budget: Budget,
    pub model: ModelConfig,
    pub system_prompt: String,
    /// Offer each granted root's `AGENTS.md` to the session as the project's instructions
    /// (see [`crate::project`]).
    pub project_instructions: bool,
    pub guards: LoopGuards,
    /// Settings of the task-understanding call of each input (see
    /// [`harness::preprocess_config`](crate::harness::preprocess_config)); `None` turns it off.
    pub preprocess: Option<crate::understand::PreprocessConfig>,
    /// The user the session works for (its long-term memory is theirs); `None`: the
    /// operating-system user.
    pub user: Option<String>,
    /// Who creates the session over the HTTP API (`None`: a local front-end).
    pub owner: Option<crate::access::Owner>,
    /// `Some`: a main session, with its workgroup's limits — it routes (no task understanding
    /// of its own; its sub-sessions get `preprocess`) and has the delegation tools. `None`: a
    /// standalone sub-session, as `keel run` makes.
    pub main: Option<crate::workgroup::Limits>,
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
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The tool catalog could not be read or changed.
    #[error(transparent)]
    Tools(#[from] crate::tools::ToolServiceError),
    /// A decision on an approval unit was refused.
    #[error(transparent)]
    Decision(#[from] DecideError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The turn could not run.
    #[error(transparent)]
    Run(#[from] AgentError),
    /// A skill could not be read or installed.
    #[error(transparent)]
    Skill(#[from] crate::skills::SkillError),
    /// A token or preset request was refused, or a principal may not do what it asked.
    #[error(transparent)]
    Access(#[from] crate::access::AccessError),
    /// A registry could not be reached or refused, or what it sent failed a digest check.
    #[error(transparent)]
    Registry(#[from] crate::oci::OciError),
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
            // The store's own kind: `not_found`, `conflict`, `input`, `corrupt` or `store`.
            Self::Store(e) => e.kind(),
            Self::Tools(e) => e.kind(),
            Self::Run(_) => "run",
            Self::Skill(e) => e.kind(),
            Self::Access(e) => e.kind(),
            Self::Registry(e) => e.kind(),
        }
    }
}

impl Harness {
    /// Creates a session: checks its grants, tools and model settings, stores it with its
    /// policy, budget and loop guards, and pins the component version of each loaded tool.
    /// Returns its id. A full specification is the operator's or an admin's; a user's session
    /// is made from a request checked against what they may do
    /// ([`create_session_for`](Self::create_session_for)).
    pub async fn create_session(
        &self,
        caller: &Caller,
        spec: SessionSpec,
    ) -> Result<SessionId, ApiError> {
        caller.require_admin("creating a session from a full specification")?;
        self.create(spec).await
    }

    /// The grants of one session: no two overlap, and none reaches keel's own home.
    pub(super) fn check_grant_set(&self, grants: &[Grant]) -> Result<(), ApiError> {
        Grant::check_disjoint(grants).map_err(|e| ApiError::Grant(e.to_string()))?;
        self.tools.check_grants(grants).map_err(|e| ApiError::Grant(e.to_string()))
    }

    pub(super) async fn create(&self, spec: SessionSpec) -> Result<SessionId, ApiError> {
        spec.model.validate()?;
        if let Some(p) = &spec.preprocess {
            p.model.validate()?;
        }
        self.check_grant_set(&spec.grants)?;
        // Every grant is bound to the directory it names now (a preset's grant carries the
        // identity it was given with; one stored without is bound here).
        let grants = spec
            .grants
            .into_iter()
            .map(Grant::bound)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::Grant(e.to_string()))?;
        self.tools.check_net(&spec.net).map_err(|e| ApiError::Grant(e.to_string()))?;
        let named_tools = spec.tools.is_some();
        let delegation = |t: &str| DELEGATION_TOOLS.contains(&t);
        let mut tools: Vec<String> = match spec.tools {
            None if self.schemas_past_share(&spec.model, &spec.system_prompt)? => {
                // A small context window: the discovery tools only, the rest loaded when a
                // task needs them (the Orchestrator's selection, tools_select).
                tracing::info!(
                    window = ?spec.model.context_window,
                    "every installed tool's schemas would pass keel's share of the window: tools are loaded on demand"
                );
                Vec::new()
            }
            None => {
                // Every installed tool, but an MCP server's only when it was added with
                // `--load always`: the others are found when needed (tools_find,
                // tools_select).
                let on_demand: Vec<String> = self
                    .tools
                    .mcp_servers()?
                    .into_iter()
                    .filter(|s| s.spec.load == crate::tools::mcp::McpLoad::OnDemand)
                    .map(|s| s.spec.name)
                    .collect();
                self.tools
                    .tools()?
                    .into_iter()
                    .filter(|t| !on_demand.contains(&t.component))
                    .map(|t| t.name)
                    .filter(|t| !delegation(t))
                    .collect()
            }
            Some(tools) => {
                for t in &tools {
                    self.tools.resolve(t).map_err(|e| ApiError::NotInstalled(e.to_string()))?;
                    if delegation(t) && spec.main.is_none() {
                        return Err(ApiError::Input(format!(
                            "`{t}` delegates to sub-sessions and works only in a main session (`keel run --main`)"
                        )));
                    }
                }
                tools
            }
        };
        if spec.main.is_some() {
            for t in DELEGATION_TOOLS {
                if !tools.iter().any(|x| x == t) && self.tools.resolve(t).is_ok() {
                    tools.push(t.to_string());
                }
            }
        }
        // The control tools (plan_create, plan_update, task_complete) come with every
        // session: the first-party component that provides them is installed in every home.
        for control in CONTROL_TOOLS {
            if !tools.iter().any(|t| t == control) && self.tools.resolve(control).is_ok() {
                tools.push(control.to_string());
            }
        }
        let known: Vec<String> = self.tools.tools()?.into_iter().map(|t| t.name).collect();
        check_rule_names(&spec.allow, &spec.ask, &spec.deny, &known).map_err(ApiError::Input)?;
        let mut policy = Policy::default();
        policy.adjust(&spec.allow, &spec.ask, &spec.deny);
        policy.redact = spec.redact;
        policy.check_patterns().map_err(ApiError::Input)?;
        // A session created over the API works for a token's principal unless its creator
        // (an admin) typed another: `alice` there is `token:alice`, never the CLI's
        // `local:alice`.
        let kind = match spec.owner {
            Some(_) => crate::memory::Kind::Token,
            None => crate::memory::Kind::Local,
        };
        let user = spec.user.map(|u| crate::memory::typed(&u, kind));
        // Pinned at the versions installed now, in the creation transaction.
        let pins = self.tools.current_pins(&tools)?;
        let system_prompt = match spec.project_instructions {
            true => format!("{}{}", spec.system_prompt, crate::project::block(&grants)),
            false => spec.system_prompt,
        };
        let new = NewSession {
            pins,
            id: spec.id,
            grants,
            net: spec.net,
            tools,
            policy,
            budget: spec.budget,
            model: spec.model,
            system_prompt,
            guards: Some(spec.guards),
            preprocess: spec.preprocess.clone(),
            user,
            named_tools,
            owner: spec.owner,
        };
        let id = match spec.main {
            Some(limits) => {
                Workgroups::of(&self.engine).create_main(new, limits, spec.preprocess).await?
            }
            None => self.engine.create(new).await?,
        };
        Ok(id.into())
    }

    /// Whether a session with `model`'s context window and `prompt` would pass
    /// [`FIXED_SHARE`](crate::assembly::FIXED_SHARE) of its window with every installed tool's
    /// schemas (compact, as a small window gets them): such a session loads its tools on
    /// demand. `false` without a known window.
    fn schemas_past_share(&self, model: &ModelConfig, prompt: &str) -> Result<bool, ApiError> {
        let Some(window) = model.context_window else { return Ok(false) };
        let catalog = self.tools.catalog()?;
        let all: Vec<String> = self.tools.tools()?.into_iter().map(|t| t.name).collect();
        let schemas = catalog
            .tools_json_as(&all, &ToolPins::new(), crate::tools::SchemaForm::Compact)
            .map_or(0, |j| j.len());
        let tokens = (prompt.len() + schemas) as f64 / crate::assembly::BYTES_PER_TOKEN;
        Ok(tokens > crate::assembly::FIXED_SHARE * window as f64)
    }

    /// Adds `tools` to an existing session (add-only), pinned at the versions installed now.
    pub async fn add_session_tools(
        &self,
        caller: &Caller,
        id: &str,
        tools: &[String],
    ) -> Result<(), ApiError> {
        let id = &SessionId::from(id);
        caller.require_admin("adding tools to a session")?;
        for t in tools {
            self.tools.resolve(t).map_err(|e| ApiError::NotInstalled(e.to_string()))?;
        }
        let selection = crate::preparation::capabilities::Selection {
            tools: tools.to_vec(),
            ..Default::default()
        };
        Preparation::of(&self.engine)
            .add_capabilities(id, selection, crate::preparation::capabilities::Via::Admin)
            .await?;
        Ok(())
    }

    /// Submits `text` to session `id` and runs its turns (or queues the input when another
    /// runner holds the session). An empty input is refused before anything is stored.
    pub async fn send(
        &self,
        caller: &Caller,
        id: &str,
        text: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Submitted, ApiError> {
        if text.trim().is_empty() {
            return Err(ApiError::Input("the message is empty: say what to do".into()));
        }
        let id = &self.checked(caller, id).await?;
        if let Some(main) = self.brain.workgroup_of(id).await? {
            // A session of a workgroup: the input is committed, then every session of the
            // workgroup with work runs until none has any left.
            let seq = self.engine.submit(id, text).await?;
            let mut ran = self.brain.run_workgroup(&main, cancel, events).await?;
            return Ok(ran.remove(id.as_str()).unwrap_or(Submitted::Queued { inbox_seq: seq }));
        }
        let (events, _live) = self.live_events(id, events);
        Ok(self.brain.submit(id, text, cancel, &events).await?)
    }

    /// `events` that also append the model's text, as it arrives, to session `id`'s live text
    /// (for the followers in other processes); the writer removes it when dropped, at the end
    /// of the drive.
    fn live_events(
        &self,
        id: &SessionId,
        events: &Events,
    ) -> (Events, Arc<crate::live::LiveWriter>) {
        let writer = Arc::new(self.live.writer(id.as_str()));
        let inner = events.clone();
        let w = writer.clone();
        let tee: Events = Arc::new(move |e: &crate::agent::Event| {
            match e {
                crate::agent::Event::TextDelta { step, text } => w.push(*step, text),
                crate::agent::Event::TextRestarted { step } => w.restart(*step),
                _ => {}
            }
            inner(e)
        });
        (tee, writer)
    }

    /// A follower of session `id`'s live text: the pieces of the reply a model is writing now,
    /// in whichever process runs the turn (transient; the durable message event follows).
    pub async fn follow_text(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<crate::live::LiveReader, ApiError> {
        let id = self.checked(caller, id).await?;
        Ok(self.live.reader(id.as_str()))
    }

    /// Commits `text` to session `id`'s inbox without running it (a front-end that runs turns
    /// in the background: [`resume`](Self::resume) then takes it). Returns its inbox sequence
    /// number; an empty input is refused before anything is stored.
    pub async fn queue(&self, caller: &Caller, id: &str, text: &str) -> Result<i64, ApiError> {
        if text.trim().is_empty() {
            return Err(ApiError::Input("the message is empty: say what to do".into()));
        }
        let id = &self.checked(caller, id).await?;
        Ok(self.engine.submit(id, text).await?)
    }

    /// Resumes session `id` (after a decision, or a recovery): runs its open turn and queued
    /// inputs. `None` when another live runner holds it (that runner resumes it).
    pub async fn resume(
        &self,
        caller: &Caller,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<Submitted>, ApiError> {
        let id = &self.checked(caller, id).await?;
        if let Some(main) = self.brain.workgroup_of(id).await? {
            // The whole workgroup: a decision on a child's call ends with its parent (and the
            // main session) having taken the child's answer.
            let mut ran = self.brain.run_workgroup(&main, cancel, events).await?;
            return Ok(ran.remove(id.as_str()).or_else(|| ran.remove(main.as_str())));
        }
        let (events, _live) = self.live_events(id, events);
        Ok(self.brain.drain(id, cancel, &events).await?)
    }

    /// Interrupts session `id`: a running turn stops at its next check, a waiting one is
    /// closed now. Returns the state the session was in.
    pub async fn interrupt(&self, caller: &Caller, id: &str) -> Result<RuntimeState, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.brain.interrupt(id).await?)
    }

    /// What recovery found when this harness opened the home: sessions whose runner was gone.
    /// Each that is [`resumable`](RecoveredSession::resumable) continues with
    /// [`resume`](Self::resume).
    pub fn recovered(&self, caller: &Caller) -> Result<&[RecoveredSession], ApiError> {
        caller.require_admin("reading what recovery found")?;
        Ok(&self.recovered)
    }

    /// Whether several hosts may share this store (it is PostgreSQL): then each host takes over
    /// the sessions of a host that stopped renewing its leases ([`take_over`](Self::take_over)).
    pub fn shared_store(&self) -> bool {
        self.engine.db().backend() == crate::sql::Backend::Postgres
    }

    /// Recovers the sessions whose runner is gone — on a shared store, a host that died or
    /// stopped renewing its leases for the lease TTL — as startup
    /// recovery does (a call whose outcome is unknown is never run again); the sessions with
    /// work to resume, which the caller then resumes as their runner.
    pub async fn take_over(&self, caller: &Caller) -> Result<Vec<RecoveredSession>, ApiError> {
        caller.require_admin("taking over sessions whose runner is gone")?;
        Ok(self.brain.recover().await?)
    }

    /// The metrics page (the Prometheus text format): the process's counters and histograms
    /// ([`crate::metrics`]), this host's store commits and syncs, and what the store holds
    /// now — sessions by state, approvals waiting and the oldest one's age, live leases.
    pub async fn metrics(&self, caller: &Caller) -> Result<String, ApiError> {
        caller.require_admin("reading the metrics")?;
        let g = self.engine.gauges().await?;
        let mut out = crate::metrics::Text::default();
        crate::metrics::render(&mut out);
        let stats = self.engine.db().stats();
        let load =
            |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed) as f64;
        out.counter(
            "keel_store_commits_total",
            "Store transactions this process committed that changed something.",
            load(&stats.commits),
        );
        out.counter(
            "keel_store_fsyncs_total",
            "Of those, the commits that waited for the log to be synced to disk.",
            load(&stats.syncs),
        );
        let by_state: Vec<_> =
            g.sessions.iter().map(|(s, n)| (vec![("state", s.as_str())], *n as f64)).collect();
        out.gauge("keel_sessions", "Sessions in the store, by state.", &by_state);
        out.gauge(
            "keel_approvals_pending",
            "Approval units waiting for a decision.",
            &[(vec![], g.approvals_pending as f64)],
        );
        let age = g.oldest_pending_ms.map_or(0.0, |t| (g.now_ms - t).max(0) as f64 / 1e3);
        out.gauge(
            "keel_approval_oldest_pending_age_seconds",
            "How long the oldest pending approval has waited (0 when none waits).",
            &[(vec![], age)],
        );
        out.gauge(
            "keel_leases_live",
            "Sessions whose runner lease is live (a host runs them now).",
            &[(vec![], g.live_leases as f64)],
        );
        Ok(out.into_string())
    }

    /// Pins every loaded tool of session `id` to the version installed now (an admin's
    /// upgrade); returns what changed.
    pub async fn upgrade_session_tools(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<PinChange>, ApiError> {
        let id = &SessionId::from(id);
        caller.require_admin("upgrading a session's tools")?;
        let loaded = Preparation::of(&self.engine).loaded(id).await?;
        let pins: ToolPins = self.tools.current_pins(&loaded.loaded_tools)?;
        Ok(Preparation::of(&self.engine).pin_tools(id, pins, true).await?)
    }

    /// Whether session `id` exists and `caller` may see it.
    pub async fn session_exists(&self, caller: &Caller, id: &str) -> Result<bool, ApiError> {
        let id = &SessionId::from(id);
        if !self.engine.exists(id).await? {
            return Ok(false);
        }
        Ok(caller.is_admin() || self.sees(caller, id).await?)
    }

    /// Everything session `id` did: turns, messages, tool calls, model calls, approvals.
    pub async fn timeline(&self, caller: &Caller, id: &str) -> Result<Timeline, ApiError> {
        let id = &self.checked(caller, id).await?;
        let mut timeline = Views::of(&self.engine).timeline(id).await?;
        // Where the next request's room goes: left out (and logged) if it cannot be
        // assembled now, rather than failing the whole timeline.
        timeline.room = match self.brain.room(id).await {
            Ok(room) => Some(room),
            Err(e) => {
                tracing::warn!(session = %id, "the next request could not be assembled: {e}");
                None
            }
        };
        Ok(timeline)
    }

    /// Where the room of session `id`'s next request goes: keel's fixed part (tool schemas
    /// among it), the summary, the kept messages and the step, against the session's window.
    pub async fn room(&self, caller: &Caller, id: &str) -> Result<RoomView, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.brain.room(id).await?)
    }

    /// Session `id`'s model calls, one per step.
    pub async fn model_calls(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<ModelCallRecord>, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Assembly::of(&self.engine).model_calls(id).await?)
    }

    /// What the model calls of turn `turn` of session `id` came to: calls, reported tokens,
    /// the last finish reason.
    pub async fn turn_usage(
        &self,
        caller: &Caller,
        id: &str,
        turn: i64,
    ) -> Result<crate::views::TurnUsage, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(crate::views::TurnUsage::of(&Assembly::of(&self.engine).model_calls(id).await?, turn))
    }

    /// The exact request body of `step` of session `id` (the last one if `None`), checked
    /// against its recorded digest.
    pub async fn evidence(
        &self,
        caller: &Caller,
        id: &str,
        step: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Assembly::of(&self.engine).evidence(id, step).await?)
    }

    /// The body of refused request `n` of session `id` (the last one if `None`).
    pub async fn refused_evidence(
        &self,
        caller: &Caller,
        id: &str,
        n: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Assembly::of(&self.engine).refused_evidence(id, n).await?)
    }

    /// The body of the understanding call of turn `turn` of session `id` (the last one if
    /// `None`), byte for byte.
    pub async fn understanding_evidence(
        &self,
        caller: &Caller,
        id: &str,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Preparation::of(&self.engine).understanding_evidence(id, turn).await?)
    }

    /// Session `id`'s events after sequence number `after`, oldest first, at most `limit`.
    pub async fn events(
        &self,
        caller: &Caller,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<EventRow>, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.engine.events_after(id, after, limit).await?)
    }

    /// The sequence number of session `id`'s last event (0 without events).
    pub async fn last_event(&self, caller: &Caller, id: &str) -> Result<i64, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.engine.last_event(id).await?)
    }

    /// Follows session `id`'s events after `after`, whichever process commits them, polling
    /// the store every `every`; the receiver gets each new event once, in order.
    pub async fn follow(
        &self,
        caller: &Caller,
        id: &str,
        after: i64,
        every: Duration,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<EventRow, StoreError>>, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.engine.follow(id, after, every))
    }

    /// Records that a client (an MCP client: its name, version, protocol and transport)
    /// reached session `id` from outside.
    pub async fn client_connected(
        &self,
        caller: &Caller,
        id: &str,
        client: String,
        version: String,
        protocol: String,
        transport: String,
    ) -> Result<(), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.engine.client_connected(id, client, version, protocol, transport).await?)
    }

    /// A direct call of `tool` with `input` (JSON object text) in session `id`, without a
    /// model step (an MCP client's `tools/call`): the session's call pipeline with one slot,
    /// under its runner lease. `ask` is put the approval unit when the policy asks about the
    /// call; it answers with a decision, or `None` when nobody can be asked (the call is then
    /// refused).
    pub async fn call_in_session<F, Fut>(
        &self,
        caller: &Caller,
        id: &str,
        tool: &str,
        input: &str,
        cancel: &CancelToken,
        ask: F,
    ) -> Result<crate::agent::DirectCall, ApiError>
    where
        F: FnOnce(ApprovalUnit) -> Fut,
        Fut: std::future::Future<Output = Option<(crate::session::Decision, Option<String>)>>,
    {
        let id = &self.checked(caller, id).await?;
        Ok(self.brain.call_direct(id, tool, input, cancel, ask).await?)
    }
}

/// Checks that every `--allow/--ask/--deny` entry names an effect class or one of
/// `tools` (the installed and host tools): a misspelled rule would otherwise be kept and
/// never match. The refusal names each one that does not, with the likeliest name.
fn check_rule_names(
    allow: &[String],
    ask: &[String],
    deny: &[String],
    tools: &[String],
) -> Result<(), String> {
    let effects: Vec<&str> = crate::policy::Effect::ALL.iter().map(|e| e.as_str()).collect();
    let mut problems = Vec::new();
    for (flag, names) in [("--allow", allow), ("--ask", ask), ("--deny", deny)] {
        for name in names {
            if name.parse::<crate::policy::Effect>().is_ok() || tools.iter().any(|t| t == name) {
                continue;
            }
            let candidates = effects.iter().copied().chain(tools.iter().map(String::as_str));
            let hint = crate::names::did_you_mean(&crate::names::closest(name, candidates));
            let shown: String = name.chars().take(80).collect();
            problems.push(format!(
                "{flag} {shown:?} names neither an installed tool nor an effect class ({}){hint}",
                effects.join(", ")
            ));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}
