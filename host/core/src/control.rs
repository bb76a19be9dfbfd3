//! What a trusted control component may ask of the session its call runs in (the
//! `keel:control` interfaces), as data: the requests that leave the sandbox with a call's
//! report and that SessionEngine commits with the call's result, and the read-only
//! [`Discovery`] a call searches the catalogs through.

use std::sync::Arc;

use serde::Serialize;

use crate::grant::Grant;
use crate::plan::{PlanRequest, PlanState};

/// Why keel refused a control request: the `keel:control` interfaces' `control-error`. Each
/// carries a message for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The request is malformed or names nothing that exists.
    #[error("{0}")]
    Invalid(String),
    /// The session's rules refuse it (a limit, grants wider than the session's, a session that
    /// is not this one's child).
    #[error("{0}")]
    Denied(String),
    /// The call has no session to ask, or the session offers no such service.
    #[error("{0}")]
    Unavailable(String),
    /// keel could not carry it out (its store failed).
    #[error("{0}")]
    Failed(String),
}

/// Bytes of one delegation request's input (`session_spawn`, `session_send`), at most.
pub const MAX_INPUT: usize = 64 * 1024;

/// A change a control call asked for; applied with the call's result, once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ControlRequest {
    /// A change of the phase's plan.
    Plan(PlanRequest),
    /// Load a skill into the session (`skills_load`).
    LoadSkill { name: String },
    /// Load tools, or whole tool sets by component name, into the session (`tools_select`).
    SelectTools { tools: Vec<String>, toolsets: Vec<String> },
    /// Remember a fact for the session's user (`memory_write`).
    Remember { text: String, tags: Vec<String> },
    /// Start a sub-session (`session_spawn`): created with the call's result.
    Spawn(Spawn),
    /// Send a sub-session of this session more work (`session_send`).
    Send { session: String, input: String },
    /// Interrupt a sub-session of this session and everything below it (`session_interrupt`).
    Interrupt { session: String },
    /// Ask the parent session something (`session_ask`).
    Ask { question: String },
}

/// An installed skill found by a search.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillHit {
    pub name: String,
    pub description: String,
}

/// An installed tool found by a search.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolHit {
    pub name: String,
    pub toolset: String,
    pub description: String,
    pub effect: String,
}

/// A page of a skill's body, or one of its reference files.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillPage {
    pub name: String,
    pub description: String,
    pub text: String,
    pub next_offset: Option<u64>,
    pub files: Vec<String>,
    pub tools: Vec<String>,
}

/// A remembered fact found by a search.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryHit {
    pub id: i64,
    pub text: String,
    pub tags: Vec<String>,
}

/// What tools a selection names: single tools and tool sets (components).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolNames {
    pub tools: Vec<String>,
    pub toolsets: Vec<String>,
}

/// Read-only search of the catalogs and of the session user's memory, for one call. Errors
/// carry messages for the model.
pub trait Discovery: Send + Sync {
    fn find_skills(&self, query: &str, limit: usize) -> Result<Vec<SkillHit>, ControlError>;
    /// Skill `name` as installed now: a page of its body from `offset`, or reference file
    /// `file`.
    fn skill_page(
        &self,
        name: &str,
        offset: u64,
        file: Option<&str>,
    ) -> Result<SkillPage, ControlError>;
    fn find_tools(&self, query: &str, limit: usize) -> Result<Vec<ToolHit>, ControlError>;
    /// Sorts `names` into installed tools and tool sets; an unknown name is an error naming it.
    fn tool_names(&self, names: &[String]) -> Result<ToolNames, ControlError>;
    fn find_memories(&self, query: &str, limit: usize) -> Result<Vec<MemoryHit>, ControlError>;
}

/// A sub-session as the delegation tools report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildStatus {
    pub session: String,
    pub purpose: String,
    pub state: String,
    pub delegation: String,
    pub terminal: Option<String>,
    pub text: Option<String>,
    pub approvals: Vec<String>,
}

/// A spawn as checked: the child to create, and what it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub spawn: Spawn,
    pub depth: u32,
}

/// The workgroup of the session a delegation call runs in: checks made when the call asks
/// (limits, grants, whose child a session is), so that the model sees a refusal as the call's
/// error. One handle serves one step, so calls of a step that run in parallel count each
/// other's spawns. Errors carry messages for the model.
pub trait Delegation: Send + Sync {
    /// Checks a spawn (the session's role, depth, live children, workgroup budget, and that
    /// `grants` only narrow the session's) and picks the child's id.
    fn check_spawn(
        &self,
        purpose: &str,
        input: &str,
        resources: &[String],
        grants: &[String],
    ) -> Result<Checked, ControlError>;
    /// Checks that `session` is a child of this session.
    fn check_child(&self, session: &str) -> Result<(), ControlError>;
    /// Checks that this session is a sub-session (it has a parent to ask).
    fn check_ask(&self, question: &str) -> Result<(), ControlError>;
    /// The status of `sessions` (children of this session; empty: all of them).
    fn status(&self, sessions: &[String]) -> Result<Vec<ChildStatus>, ControlError>;
}

/// What a control call is given of its session: the plan as it stands and, for a call made in
/// a session, the discovery and delegation handles.
#[derive(Clone, Default)]
pub struct ControlSession {
    pub plan: PlanState,
    pub discovery: Option<Arc<dyn Discovery>>,
    pub delegation: Option<Arc<dyn Delegation>>,
}

impl std::fmt::Debug for ControlSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlSession")
            .field("plan", &self.plan)
            .field("discovery", &self.discovery.is_some())
            .finish()
    }
}

/// A child to create with the spawning call's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Spawn {
    /// The id chosen for it when the call was checked.
    pub child: String,
    pub purpose: String,
    pub input: String,
    pub resources: Vec<String>,
    /// Its grants: inside the parent's, same or weaker access.
    pub grants: Vec<Grant>,
}
