//! A call's row in the journal, and a control call's requests applied with its result by the
//! sub-owner of each fact: plan
//! changes by the plan's versions (`plan.rs`), skills and tools to load by the loaded
//! capabilities (`capabilities.rs`), facts to remember by the user's memory
//! ([`crate::memory`]), spawns, sends, interrupts and questions by the workgroup
//! (`workgroup.rs`). The journal writer ([`super::facts::put_journal`]) writes the call's row
//! only; [`record_in`] is what every commit of a call's row goes through.

use crate::sql::Connection;

use super::JournalEntry;
use crate::store::StoreError;

/// Writes call `e` of step `step` to the journal and, when it finished with control requests,
/// applies them in the same transaction.
pub fn record_in(c: &Connection, id: &str, step: i64, e: &JournalEntry) -> Result<(), StoreError> {
    super::facts::put_journal(c, id, step, e)?;
    if e.status == super::JournalStatus::Done && !e.control_requests.is_empty() {
        apply_in(c, id, &e.call_id, &e.control_requests)?;
    }
    Ok(())
}

/// Applies the changes control call `call_id` asked for, in the transaction that records its
/// result: plan changes (once per call), skills and tools to load (add-only, so writing the
/// result again adds nothing), facts to remember (once per call).
fn apply_in(
    c: &Connection,
    id: &str,
    call_id: &str,
    requests: &[crate::control::ControlRequest],
) -> Result<(), StoreError> {
    use super::capabilities::{Selection, Via, add_in};
    use crate::control::ControlRequest;
    let plan: Vec<crate::plan::PlanRequest> = requests
        .iter()
        .filter_map(|r| match r {
            ControlRequest::Plan(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    if !plan.is_empty() {
        super::plan::apply_in(c, id, call_id, &plan)?;
    }
    let turn = super::facts::load_counters(c, id)?.active_turn();
    for r in requests {
        match r {
            ControlRequest::Plan(_) => {}
            ControlRequest::LoadSkill { name } => {
                let s = Selection { skills: vec![name.clone()], ..Selection::default() };
                add_in(c, id, &s, Via::SkillsLoad, turn, Some(call_id))?;
            }
            ControlRequest::SelectTools { tools, toolsets } => {
                let s = Selection {
                    tools: tools.clone(),
                    toolsets: toolsets.clone(),
                    ..Selection::default()
                };
                add_in(c, id, &s, Via::ToolsSelect, turn, Some(call_id))?;
            }
            ControlRequest::Remember { text, tags } => {
                let user = super::config::config_in(c, id)?.user();
                match crate::memory::add_in(c, &user, text, tags, Some((id, call_id))) {
                    Err(StoreError::Input(why)) => {
                        tracing::warn!(
                            session = id,
                            call = call_id,
                            "a memory was not kept: {why}"
                        );
                    }
                    other => {
                        other?;
                    }
                }
            }
            ControlRequest::Spawn(spawn) => super::workgroup::spawn_in(c, id, call_id, spawn)?,
            ControlRequest::Send { session, input } => {
                super::workgroup::send_in(c, id, call_id, session, input)?;
            }
            ControlRequest::Interrupt { session } => {
                super::workgroup::stop_in(c, session, None)?;
            }
            ControlRequest::Ask { question } => {
                super::workgroup::ask_in(c, id, call_id, question)?;
            }
        }
    }
    Ok(())
}
