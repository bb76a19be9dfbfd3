//! Plans: the steps of a session's current phase, and the one function that changes them.
//!
//! A trusted control component asks for changes through `keel:control/plan`; the host checks
//! each against the plan as the call sees it ([`apply`]), and SessionEngine applies the
//! accepted requests again, with the same function, when it commits the call's result — so
//! what the model was told and what the session holds cannot differ.

use serde::{Deserialize, Serialize};

crate::stored_enum! {
    /// Where a step of a plan stands.
    pub enum StepStatus: "plan step status" {
        Pending = "pending",
        InProgress = "in_progress",
        Done = "done",
        Skipped = "skipped",
    }
}

/// Most steps in a plan.
pub const MAX_STEPS: usize = 64;
/// Longest step text or note, in characters.
pub const MAX_TEXT: usize = 500;
/// Longest completion summary, in characters.
pub const MAX_SUMMARY: usize = 4000;

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    pub text: String,
    pub status: StepStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A change a control component asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanRequest {
    /// Replace the phase's plan with these steps, all pending.
    Create { steps: Vec<String> },
    /// Set step `step` (from 1) to `status`.
    Update {
        step: u32,
        status: StepStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// Close the current phase.
    Complete { summary: String },
}

impl PlanRequest {
    /// The stored name of the change.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Update { .. } => "update",
            Self::Complete { .. } => "complete",
        }
    }
}

/// The plan state a change applies to: the current phase's plan (`None`: none yet) and
/// whether a phase is open at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanState {
    pub steps: Option<Vec<PlanStep>>,
    pub phase_open: bool,
}

fn text(what: &str, t: &str, max: usize) -> Result<String, String> {
    let t = t.trim();
    if t.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if t.chars().count() > max {
        return Err(format!("{what} is longer than {max} characters"));
    }
    Ok(t.to_string())
}

/// Applies `request` to `state`, or says why it cannot be applied (and changes nothing).
pub fn apply(state: &mut PlanState, request: &PlanRequest) -> Result<(), String> {
    if !state.phase_open {
        return Err(
            "no phase is open: the last one was completed; a new input opens the next".to_string()
        );
    }
    match request {
        PlanRequest::Create { steps } => {
            if steps.is_empty() {
                return Err("a plan needs at least one step".into());
            }
            if steps.len() > MAX_STEPS {
                return Err(format!("a plan has at most {MAX_STEPS} steps, not {}", steps.len()));
            }
            let steps = steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    Ok(PlanStep {
                        text: text(&format!("step {}", i + 1), s, MAX_TEXT)?,
                        status: StepStatus::Pending,
                        note: None,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            state.steps = Some(steps);
        }
        PlanRequest::Update { step, status, note } => {
            let steps = state
                .steps
                .as_mut()
                .ok_or("the phase has no plan yet: create one with plan_create")?;
            let n = steps.len();
            let at = (*step as usize)
                .checked_sub(1)
                .and_then(|i| steps.get_mut(i))
                .ok_or_else(|| format!("the plan has steps 1 to {n}; there is no step {step}"))?;
            let note = note.as_deref().map(|t| text("the note", t, MAX_TEXT)).transpose()?;
            at.status = *status;
            if note.is_some() {
                at.note = note;
            }
        }
        PlanRequest::Complete { summary } => {
            text("the summary", summary, MAX_SUMMARY)?;
            state.phase_open = false;
        }
    }
    Ok(())
}

/// The plan as the model is shown it in the system message.
pub fn render(steps: &[PlanStep]) -> String {
    let mut out = String::from("Plan of the current phase:");
    for (i, s) in steps.iter().enumerate() {
        out.push_str(&format!("\n{}. [{}] {}", i + 1, s.status, s.text));
        if let Some(n) = &s.note {
            out.push_str(&format!(" — {n}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> PlanState {
        PlanState { steps: None, phase_open: true }
    }

    #[test]
    fn changes_are_checked_against_the_plan_as_it_stands() {
        let mut s = open();
        let update = |step, status| PlanRequest::Update { step, status, note: None };
        assert!(apply(&mut s, &update(1, StepStatus::Done)).unwrap_err().contains("no plan"));
        apply(&mut s, &PlanRequest::Create { steps: vec!["read".into(), "write".into()] }).unwrap();
        apply(&mut s, &update(2, StepStatus::InProgress)).unwrap();
        assert_eq!(s.steps.as_ref().unwrap()[1].status, StepStatus::InProgress);
        for bad in [0, 3] {
            let before = s.clone();
            assert!(apply(&mut s, &update(bad, StepStatus::Done)).is_err(), "step {bad}");
            assert_eq!(s, before, "a refused change changes nothing");
        }
        assert!(apply(&mut s, &PlanRequest::Create { steps: vec![] }).is_err());
        assert!(apply(&mut s, &PlanRequest::Create { steps: vec!["  ".into()] }).is_err());
        apply(&mut s, &PlanRequest::Complete { summary: "done".into() }).unwrap();
        assert!(!s.phase_open);
        assert!(apply(&mut s, &update(1, StepStatus::Done)).unwrap_err().contains("no phase"));
        assert!(render(s.steps.as_ref().unwrap()).contains("2. [in_progress] write"));
    }
}
