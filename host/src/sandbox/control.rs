//! The `keel:control/plan` interface: linked only for components trusted with it.
//!
//! A call of a trusted component gets the session's plan as it stands ([`ControlCtx`]); each
//! change the component asks for is checked and applied to that copy with
//! [`plan::apply`] and kept as a request. The requests leave the sandbox
//! with the call's report; SessionEngine commits them with the call's result.

use wasmtime::component::{HasData, Linker};

use super::host_api::bindings::keel::control::plan as wit;
use crate::plan::{self, PlanRequest, PlanState, PlanStep, StepStatus};

/// Change requests one call may make at most.
pub const MAX_REQUESTS: usize = 256;

/// The plan a call of a control component sees, and what it asked for.
#[derive(Debug, Clone, Default)]
pub struct ControlCtx {
    pub state: PlanState,
    pub requests: Vec<PlanRequest>,
}

impl ControlCtx {
    /// The context of a call made for a session whose plan state is `state`.
    pub fn new(state: PlanState) -> Self {
        Self { state, requests: Vec::new() }
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
        ctx.requests.push(request);
        Ok(())
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

struct HasControl;

impl HasData for HasControl {
    type Data<'a> = Control<'a>;
}

/// Adds `keel:control/plan` to `linker`.
pub fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> Control<'_>,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, HasControl>(linker, get)
}
