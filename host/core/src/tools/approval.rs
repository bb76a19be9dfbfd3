//! The approval gate's token: proof that an approved unit was consumed for one call.

use crate::ids::{CallId, UnitId};

/// Proof that SessionEngine consumed an approval for one call: what the person approved
/// (tool, component, exact input). Only SessionEngine can make one — by consuming an `approved`
/// unit in the same transaction as the call's intent, or by finding the unit a crashed call
/// already consumed — so the tool chain's approval gate has no way around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedApproval {
    unit: UnitId,
    call_id: CallId,
    tool: String,
    input_digest: String,
    component_digest: String,
}

impl ConsumedApproval {
    /// The approval unit's id.
    pub fn unit(&self) -> &str {
        &self.unit
    }

    /// The call it was consumed for.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// Whether it approves running `tool` of the component with sha256 `component_digest` on
    /// exactly `input`.
    pub fn binds(&self, tool: &str, component_digest: &str, input: &str) -> bool {
        self.tool == tool
            && self.component_digest == component_digest
            && self.input_digest == crate::digest::sha256_hex(input.as_bytes())
    }

    /// Made only by SessionEngine (`session/steps.rs`), from the approval row it consumed in
    /// a call's intent commit or found consumed by that call; a test of the layers checks
    /// that no other module makes one.
    pub(crate) fn new(
        unit: UnitId,
        call_id: CallId,
        tool: String,
        input_digest: String,
        component_digest: String,
    ) -> Self {
        Self { unit, call_id, tool, input_digest, component_digest }
    }
}
