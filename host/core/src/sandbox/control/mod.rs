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

mod v1;

use super::host_api::bindings::keel::control::capabilities as caps;
use super::host_api::bindings::keel::control::memory as mem;
use super::host_api::bindings::keel::control::plan as wit;
use super::host_api::bindings::keel::control::sessions as ses;
use super::host_api::bindings::keel::control::types;
use crate::control::{ControlError, ControlRequest, ControlSession, Delegation, Discovery};
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

    fn ask(&mut self, request: PlanRequest) -> Result<(), ControlError> {
        let ctx = self.ctx.as_mut().ok_or_else(|| {
            ControlError::Unavailable("this call runs outside a session: there is no plan".into())
        })?;
        if ctx.requests.len() >= MAX_REQUESTS {
            return Err(ControlError::Denied(format!(
                "a call may change the plan {MAX_REQUESTS} times at most"
            )));
        }
        plan::apply(&mut ctx.state, &request).map_err(ControlError::Invalid)?;
        ctx.requests.push(ControlRequest::Plan(request));
        Ok(())
    }

    /// Keeps a request to commit with the call's result.
    fn request(&mut self, request: ControlRequest) -> Result<(), ControlError> {
        let ctx = self
            .ctx
            .as_mut()
            .ok_or_else(|| ControlError::Unavailable("this call runs outside a session".into()))?;
        if ctx.requests.len() >= MAX_REQUESTS {
            return Err(ControlError::Denied(format!(
                "a call may make {MAX_REQUESTS} requests at most"
            )));
        }
        ctx.requests.push(request);
        Ok(())
    }

    fn discovery(&self) -> Result<std::sync::Arc<dyn Discovery>, ControlError> {
        self.ctx.as_ref().and_then(|c| c.discovery.clone()).ok_or_else(|| {
            ControlError::Unavailable(
                "this call runs outside a session: there is nothing to search".into(),
            )
        })
    }

    fn delegation(&self) -> Result<std::sync::Arc<dyn Delegation>, ControlError> {
        self.ctx.as_ref().and_then(|c| c.delegation.clone()).ok_or_else(|| {
            ControlError::Unavailable(
                "this call runs outside a session: there is no workgroup".into(),
            )
        })
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

    fn create(&mut self, steps: Vec<String>) -> Result<Vec<wit::Step>, Refusal> {
        self.ask(PlanRequest::Create { steps })?;
        Ok(self.steps())
    }

    fn update(
        &mut self,
        step: u32,
        status: wit::StepStatus,
        note: Option<String>,
    ) -> Result<Vec<wit::Step>, Refusal> {
        let status = match status {
            wit::StepStatus::Pending => StepStatus::Pending,
            wit::StepStatus::InProgress => StepStatus::InProgress,
            wit::StepStatus::Done => StepStatus::Done,
            wit::StepStatus::Skipped => StepStatus::Skipped,
        };
        self.ask(PlanRequest::Update { step, status, note })?;
        Ok(self.steps())
    }

    fn complete(&mut self, summary: String) -> Result<(), Refusal> {
        Ok(self.ask(PlanRequest::Complete { summary })?)
    }
}

/// keel's refusal of a control request, as the interfaces return it.
type Refusal = types::ControlError;

/// `keel:control/types` declares only the error type.
impl types::Host for Control<'_> {}

impl From<ControlError> for types::ControlError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Invalid(m) => Self::Invalid(m),
            ControlError::Denied(m) => Self::Denied(m),
            ControlError::Unavailable(m) => Self::Unavailable(m),
            ControlError::Failed(m) => Self::Failed(m),
        }
    }
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::Invalid(message.into())
}

fn limit(n: u32) -> usize {
    n.clamp(1, MAX_RESULTS) as usize
}

impl caps::Host for Control<'_> {
    fn find_skills(&mut self, query: String, n: u32) -> Result<Vec<caps::SkillHit>, Refusal> {
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
    ) -> Result<caps::SkillPage, Refusal> {
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

    fn find_tools(&mut self, query: String, n: u32) -> Result<Vec<caps::ToolHit>, Refusal> {
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

    fn select_tools(&mut self, names: Vec<String>) -> Result<Vec<String>, Refusal> {
        if names.is_empty() {
            return Err(invalid("name at least one tool or tool set"));
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
    fn remember(&mut self, text: String, tags: Vec<String>) -> Result<(), Refusal> {
        self.discovery()?;
        let (text, tags) = crate::memory::check(&text, &tags).map_err(invalid)?;
        Ok(self.request(ControlRequest::Remember { text, tags })?)
    }

    fn find(&mut self, query: String, n: u32) -> Result<Vec<mem::MemoryItem>, Refusal> {
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
    ) -> Result<ses::Spawned, Refusal> {
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

    fn send(&mut self, session: String, input: String) -> Result<(), Refusal> {
        if input.trim().is_empty() {
            return Err(invalid("the input is empty: say what the sub-session should do"));
        }
        if input.len() > crate::control::MAX_INPUT {
            return Err(invalid(format!("the input is over {} bytes", crate::control::MAX_INPUT)));
        }
        self.delegation()?.check_child(&session)?;
        Ok(self.request(ControlRequest::Send { session, input })?)
    }

    fn status(&mut self, sessions: Vec<String>) -> Result<Vec<ses::ChildStatus>, Refusal> {
        if sessions.len() > 256 {
            return Err(invalid("name at most 256 sessions"));
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

    fn interrupt(&mut self, session: String) -> Result<(), Refusal> {
        self.delegation()?.check_child(&session)?;
        Ok(self.request(ControlRequest::Interrupt { session })?)
    }

    fn ask(&mut self, question: String) -> Result<(), Refusal> {
        self.delegation()?.check_ask(&question)?;
        Ok(self.request(ControlRequest::Ask { question })?)
    }
}

struct HasControl;

impl HasData for HasControl {
    type Data<'a> = Control<'a>;
}

/// Adds the `keel:control` interfaces to `linker`: 0.2.0, and 0.1.0 for the components built
/// against it that sessions pinned.
pub fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> Control<'_>,
) -> wasmtime::Result<()> {
    types::add_to_linker::<T, HasControl>(linker, get)?;
    wit::add_to_linker::<T, HasControl>(linker, get)?;
    caps::add_to_linker::<T, HasControl>(linker, get)?;
    mem::add_to_linker::<T, HasControl>(linker, get)?;
    ses::add_to_linker::<T, HasControl>(linker, get)?;
    v1::add_to_linker(linker, get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_why_in_its_kind() {
        // Outside a session: nothing to ask.
        let mut none = None;
        let e = wit::Host::create(&mut Control::new(&mut none), vec!["a".into()]).unwrap_err();
        assert!(matches!(e, Refusal::Unavailable(_)), "{e:?}");

        // A step the plan does not have: the request is invalid.
        let session = ControlSession {
            plan: PlanState { steps: None, phase_open: true },
            ..ControlSession::default()
        };
        let mut ctx = Some(ControlCtx::new(session));
        let mut c = Control::new(&mut ctx);
        assert_eq!(wit::Host::create(&mut c, vec!["read".into()]).unwrap().len(), 1);
        let e = wit::Host::update(&mut c, 9, wit::StepStatus::Done, None).unwrap_err();
        assert!(matches!(&e, Refusal::Invalid(m) if m.contains("there is no step 9")), "{e:?}");

        // More requests than a call may make: the session's rules refuse it.
        for _ in 1..MAX_REQUESTS {
            wit::Host::update(&mut c, 1, wit::StepStatus::InProgress, None).unwrap();
        }
        let e = wit::Host::update(&mut c, 1, wit::StepStatus::Done, None).unwrap_err();
        assert!(matches!(e, Refusal::Denied(_)), "{e:?}");
        // No discovery handle in this session: searching is unavailable.
        let e = caps::Host::find_skills(&mut c, "notes".into(), 5).unwrap_err();
        assert!(matches!(e, Refusal::Unavailable(_)), "{e:?}");
    }
}
