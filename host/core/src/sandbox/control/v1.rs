//! `keel:control@0.1.0`, whose errors were strings, still linked: a session pins the version
//! of each tool it loaded, so a control component built against 0.1.0 keeps running in the
//! sessions that pinned it after keel moves to 0.2.0. Each function is the 0.2.0 one, its
//! typed refusal given as its message.

use wasmtime::component::Linker;

use super::{Control, HasControl};
use crate::sandbox::host_api::bindings::keel::control as v2;

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit-v1",
        world: "keel:compat/control-v1",
    });
}

use bindings::keel::control::{capabilities as caps, memory as mem, plan, sessions as ses};

fn message(e: v2::types::ControlError) -> String {
    match e {
        v2::types::ControlError::Invalid(m)
        | v2::types::ControlError::Denied(m)
        | v2::types::ControlError::Unavailable(m)
        | v2::types::ControlError::Failed(m) => m,
    }
}

fn step(s: v2::plan::Step) -> plan::Step {
    let status = match s.status {
        v2::plan::StepStatus::Pending => plan::StepStatus::Pending,
        v2::plan::StepStatus::InProgress => plan::StepStatus::InProgress,
        v2::plan::StepStatus::Done => plan::StepStatus::Done,
        v2::plan::StepStatus::Skipped => plan::StepStatus::Skipped,
    };
    plan::Step { text: s.text, status, note: s.note }
}

fn steps(s: Vec<v2::plan::Step>) -> Vec<plan::Step> {
    s.into_iter().map(step).collect()
}

impl plan::Host for Control<'_> {
    fn current(&mut self) -> Option<Vec<plan::Step>> {
        v2::plan::Host::current(self).map(steps)
    }

    fn create(&mut self, list: Vec<String>) -> Result<Vec<plan::Step>, String> {
        v2::plan::Host::create(self, list).map(steps).map_err(message)
    }

    fn update(
        &mut self,
        n: u32,
        status: plan::StepStatus,
        note: Option<String>,
    ) -> Result<Vec<plan::Step>, String> {
        let status = match status {
            plan::StepStatus::Pending => v2::plan::StepStatus::Pending,
            plan::StepStatus::InProgress => v2::plan::StepStatus::InProgress,
            plan::StepStatus::Done => v2::plan::StepStatus::Done,
            plan::StepStatus::Skipped => v2::plan::StepStatus::Skipped,
        };
        v2::plan::Host::update(self, n, status, note).map(steps).map_err(message)
    }

    fn complete(&mut self, summary: String) -> Result<(), String> {
        v2::plan::Host::complete(self, summary).map_err(message)
    }
}

impl caps::Host for Control<'_> {
    fn find_skills(&mut self, query: String, n: u32) -> Result<Vec<caps::SkillHit>, String> {
        let hits = v2::capabilities::Host::find_skills(self, query, n).map_err(message)?;
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
        let p = v2::capabilities::Host::load_skill(self, name, offset, file).map_err(message)?;
        Ok(caps::SkillPage {
            name: p.name,
            description: p.description,
            text: p.text,
            next_offset: p.next_offset,
            files: p.files,
            tools: p.tools,
        })
    }

    fn find_tools(&mut self, query: String, n: u32) -> Result<Vec<caps::ToolHit>, String> {
        let hits = v2::capabilities::Host::find_tools(self, query, n).map_err(message)?;
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
        v2::capabilities::Host::select_tools(self, names).map_err(message)
    }
}

impl mem::Host for Control<'_> {
    fn remember(&mut self, text: String, tags: Vec<String>) -> Result<(), String> {
        v2::memory::Host::remember(self, text, tags).map_err(message)
    }

    fn find(&mut self, query: String, n: u32) -> Result<Vec<mem::MemoryItem>, String> {
        let hits = v2::memory::Host::find(self, query, n).map_err(message)?;
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
        let s =
            v2::sessions::Host::spawn(self, purpose, input, resources, grants).map_err(message)?;
        Ok(ses::Spawned { session: s.session, depth: s.depth, grants: s.grants })
    }

    fn send(&mut self, session: String, input: String) -> Result<(), String> {
        v2::sessions::Host::send(self, session, input).map_err(message)
    }

    fn status(&mut self, sessions: Vec<String>) -> Result<Vec<ses::ChildStatus>, String> {
        let list = v2::sessions::Host::status(self, sessions).map_err(message)?;
        Ok(list
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
        v2::sessions::Host::interrupt(self, session).map_err(message)
    }

    fn ask(&mut self, question: String) -> Result<(), String> {
        v2::sessions::Host::ask(self, question).map_err(message)
    }
}

/// Adds the `keel:control@0.1.0` interfaces to `linker`.
pub fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> Control<'_>,
) -> wasmtime::Result<()> {
    plan::add_to_linker::<T, HasControl>(linker, get)?;
    caps::add_to_linker::<T, HasControl>(linker, get)?;
    mem::add_to_linker::<T, HasControl>(linker, get)?;
    ses::add_to_linker::<T, HasControl>(linker, get)
}
