//! What a trusted control component may ask of the session its call runs in (the
//! `keel:control` interfaces), as data: the requests that leave the sandbox with a call's
//! report and that SessionEngine commits with the call's result, and the read-only
//! [`Discovery`] a call searches the catalogs through.

use std::sync::Arc;

use serde::Serialize;

use crate::plan::{PlanRequest, PlanState};

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
/// are messages for the model.
pub trait Discovery: Send + Sync {
    fn find_skills(&self, query: &str, limit: usize) -> Result<Vec<SkillHit>, String>;
    /// Skill `name` as installed now: a page of its body from `offset`, or reference file
    /// `file`.
    fn skill_page(&self, name: &str, offset: u64, file: Option<&str>) -> Result<SkillPage, String>;
    fn find_tools(&self, query: &str, limit: usize) -> Result<Vec<ToolHit>, String>;
    /// Sorts `names` into installed tools and tool sets; an unknown name is an error naming it.
    fn tool_names(&self, names: &[String]) -> Result<ToolNames, String>;
    fn find_memories(&self, query: &str, limit: usize) -> Result<Vec<MemoryHit>, String>;
}

/// What a control call is given of its session: the plan as it stands and, for a call made in
/// a session, the discovery handle.
#[derive(Clone, Default)]
pub struct ControlSession {
    pub plan: PlanState,
    pub discovery: Option<Arc<dyn Discovery>>,
}

impl std::fmt::Debug for ControlSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlSession")
            .field("plan", &self.plan)
            .field("discovery", &self.discovery.is_some())
            .finish()
    }
}
