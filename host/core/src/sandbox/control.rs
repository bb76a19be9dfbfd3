//! The `keel:control` interfaces (`plan`, `capabilities`, `memory`, `sessions`): linked only for
//! components trusted with them.
//!
//! A call of a trusted component gets what it may see of its session ([`ControlCtx`]): the
//! plan as it stands, and a read-only [`Discovery`] of the catalogs and the user's memory.
//! Each change the component asks for — a plan change (checked and applied to the call's copy
//! with [`plan::apply`]), a skill or tools to load, a fact to remember — is kept as a
//! [`ControlRequest`]. The requests leave the sandbox with the call's report; SessionEngine
//! commits them with the call's result.

use wasmtime::component::{HasData, Linker};

use super::host_api::bindings::keel::control::capabilities as caps;
use super::host_api::bindings::keel::control::memory as mem;
use super::host_api::bindings::keel::control::plan as wit;
use super::host_api::bindings::keel::control::sessions as ses;
use crate::control::{ControlRequest, ControlSession, Delegation, Discovery};
use crate::plan::{self, PlanRequest, PlanState, PlanStep, StepStatus};

/// Change requests one call may make at most.
pub const MAX_REQUESTS: usize = 256;
/// Results one search returns at most.
pub const MAX_RESULTS: u32 = 50;

/// What a call of a control component sees of its session, and what it asked for.
#[derive(Clone, Default)]
pub struct ControlCtx {
    pub state: PlanState,
    discovery: Option<std::sync::Arc<dyn Discovery>>,
    delegation: Option<std::sync::Arc<dyn Delegation>>,
    pub requests: Vec<ControlRequest>,
}

impl std::fmt::Debug for ControlCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlCtx")
            .field("state", &self.state)
            .field("requests", &self.requests)
            .finish()
    }
}

impl ControlCtx {
    /// The context of a call made for a session.
    pub fn new(session: ControlSession) -> Self {
        Self {
            state: session.plan,
            discovery: session.discovery,
            delegation: session.delegation,
            requests: Vec::new(),
        }
    }
}

/// A borrowed view of a call's control context (`None`: the call was made outside a session,
/// as `describe` is).
pub struct Control<'a> {
    ctx: &'a mut Option<ControlCtx>,
}

impl<'a> Control<'a> {
    pub fn new(ctx: &'a mut Option<ControlCtx>) -> Self {
        Self { ctx }
    }

    fn ask(&mut self, request: PlanRequest) -> Result<(), String> {
        let ctx = self.ctx.as_mut().ok_or("this call runs outside a session: there is no plan")?;
        if ctx.requests.len() >= MAX_REQUESTS {
            return Err(format!("a call may change the plan {MAX_REQUESTS} times at most"));
        }
        plan::apply(&mut ctx.state, &request)?;
        ctx.requests.push(ControlRequest::Plan(request));
        Ok(())
    }

    /// Keeps a request to commit with the call's result.
    fn request(&mut self, request: ControlRequest) -> Result<(), String> {
        let ctx = self.ctx.as_mut().ok_or("this call runs outside a session")?;
        if ctx.requests.len() >= MAX_REQUESTS {
            return Err(format!("a call may make {MAX_REQUESTS} requests at most"));
        }
        ctx.requests.push(request);
        Ok(())
    }

    fn discovery(&self) -> Result<std::sync::Arc<dyn Discovery>, String> {
        self.ctx.as_ref().and_then(|c| c.discovery.clone()).ok_or_else(|| {
            "this call runs outside a session: there is nothing to search".to_string()
        })
    }

    fn delegation(&self) -> Result<std::sync::Arc<dyn Delegation>, String> {
        self.ctx
            .as_ref()
            .and_then(|c| c.delegation.clone())
            .ok_or_else(|| "this call runs outside a session: there is no workgroup".to_string())
    }

    fn steps(&self) -> Vec<wit::Step> {
        let steps = self.ctx.as_ref().and_then(|c| c.state.steps.as_deref()).unwrap_or_default();
        steps.iter().map(to_wit).collect()
    }
}

fn status_to_wit(s: StepStatus) -> wit::StepStatus {
    match s {
        StepStatus::Pending => wit::StepStatus::Pending,
        StepStatus::InProgress => wit::StepStatus::InProgress,
        StepStatus::Done => wit::StepStatus::Done,
        StepStatus::Skipped => wit::StepStatus::Skipped,
    }
}

fn to_wit(s: &PlanStep) -> wit::Step {
    wit::Step { text: s.text.clone(), status: status_to_wit(s.status), note: s.note.clone() }
}

impl wit::Host for Control<'_> {
    fn current(&mut self) -> Option<Vec<wit::Step>> {
        self.ctx.as_ref().and_then(|c| c.state.steps.as_ref())?;
        Some(self.steps())
    }

    fn create(&mut self, steps: Vec<String>) -> Result<Vec<wit::Step>, String> {
        self.ask(PlanRequest::Create { steps })?;
        Ok(self.steps())
    }

    fn update(
        &mut self,
        step: u32,
        status: wit::StepStatus,
        note: Option<String>,
    ) -> Result<Vec<wit::Step>, String> {
        let status = match status {
            wit::StepStatus::Pending => StepStatus::Pending,
            wit::StepStatus::InProgress => StepStatus::InProgress,
            wit::StepStatus::Done => StepStatus::Done,
            wit::StepStatus::Skipped => StepStatus::Skipped,
        };
        self.ask(PlanRequest::Update { step, status, note })?;
        Ok(self.steps())
    }

    fn complete(&mut self, summary: String) -> Result<(), String> {
        self.ask(PlanRequest::Complete { summary })
    }
}

fn limit(n: u32) -> usize {
    n.clamp(1, MAX_RESULTS) as usize
}

impl caps::Host for Control<'_> {
    fn find_skills(&mut self, query: String, n: u32) -> Result<Vec<caps::SkillHit>, String> {
        let hits = self.discovery()?.find_skills(&query, limit(n))?;
        Ok(hits
            .into_iter()
            .map(|h| caps::SkillHit { name: h.name, description: h.description })
            .collect())
    }

    fn load_skill(
        &mut self,
        name: String,
        offset: u64,
        file: Option<String>,
    ) -> Result<caps::SkillPage, String> {
        let page = self.discovery()?.skill_page(&name, offset, file.as_deref())?;
        self.request(ControlRequest::LoadSkill { name })?;
        Ok(caps::SkillPage {
            name: page.name,
            description: page.description,
            text: page.text,
            next_offset: page.next_offset,
            files: page.files,
            tools: page.tools,
        })
    }

    fn find_tools(&mut self, query: String, n: u32) -> Result<Vec<caps::ToolHit>, String> {
        let hits = self.discovery()?.find_tools(&query, limit(n))?;
        Ok(hits
            .into_iter()
            .map(|h| caps::ToolHit {
                name: h.name,
                toolset: h.toolset,
                description: h.description,
                effect: h.effect,
            })
            .collect())
    }

    fn select_tools(&mut self, names: Vec<String>) -> Result<Vec<String>, String> {
        if names.is_empty() {
            return Err("name at least one tool or tool set".into());
        }
        let sorted = self.discovery()?.tool_names(&names)?;
        let accepted = sorted.tools.iter().chain(&sorted.toolsets).cloned().collect();
        self.request(ControlRequest::SelectTools {
            tools: sorted.tools,
            toolsets: sorted.toolsets,
        })?;
        Ok(accepted)
    }
}

impl mem::Host for Control<'_> {
    fn remember(&mut self, text: String, tags: Vec<String>) -> Result<(), String> {
        self.discovery()?;
        let (text, tags) = crate::memory::check(&text, &tags)?;
        self.request(ControlRequest::Remember { text, tags })
    }

    fn find(&mut self, query: String, n: u32) -> Result<Vec<mem::MemoryItem>, String> {
        let hits = self.discovery()?.find_memories(&query, limit(n))?;
        Ok(hits
            .into_iter()
            .map(|h| mem::MemoryItem { id: h.id, text: h.text, tags: h.tags })
            .collect())
    }
}

impl ses::Host for Control<'_> {
    fn spawn(
        &mut self,
        purpose: String,
        input: String,
        resources: Vec<String>,
        grants: Vec<String>,
    ) -> Result<ses::Spawned, String> {
        let checked = self.delegation()?.check_spawn(&purpose, &input, &resources, &grants)?;
        let spawned = ses::Spawned {
            session: checked.spawn.child.clone(),
            depth: checked.depth,
            grants: checked
                .spawn
                .grants
                .iter()
                .map(|g| format!("{}:{}", g.guest, g.access))
                .collect(),
        };
        self.request(ControlRequest::Spawn(checked.spawn))?;
        Ok(spawned)
    }

    fn send(&mut self, session: String, input: String) -> Result<(), String> {
        if input.trim().is_empty() {
            return Err("the input is empty: say what the sub-session should do".into());
        }
        if input.len() > crate::control::MAX_INPUT {
            return Err(format!("the input is over {} bytes", crate::control::MAX_INPUT));
        }
        self.delegation()?.check_child(&session)?;
        self.request(ControlRequest::Send { session, input })
    }

    fn status(&mut self, sessions: Vec<String>) -> Result<Vec<ses::ChildStatus>, String> {
        if sessions.len() > 256 {
            return Err("name at most 256 sessions".into());
        }
        Ok(self
            .delegation()?
            .status(&sessions)?
            .into_iter()
            .map(|s| ses::ChildStatus {
                session: s.session,
                purpose: s.purpose,
                state: s.state,
                delegation: s.delegation,
                terminal: s.terminal,
                text: s.text,
                approvals: s.approvals,
            })
            .collect())
    }

    fn interrupt(&mut self, session: String) -> Result<(), String> {
        self.delegation()?.check_child(&session)?;
        self.request(ControlRequest::Interrupt { session })
    }

    fn ask(&mut self, question: String) -> Result<(), String> {
        self.delegation()?.check_ask(&question)?;
        self.request(ControlRequest::Ask { question })
    }
}

struct HasControl;

impl HasData for HasControl {
    type Data<'a> = Control<'a>;
}

/// Adds the `keel:control` interfaces to `linker`.
pub fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> Control<'_>,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, HasControl>(linker, get)?;
    caps::add_to_linker::<T, HasControl>(linker, get)?;
    mem::add_to_linker::<T, HasControl>(linker, get)?;
    ses::add_to_linker::<T, HasControl>(linker, get)
}
