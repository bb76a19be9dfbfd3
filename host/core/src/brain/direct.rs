//! Direct calls: a front-end (an MCP client) calls one tool in a session, without a model.
//!
//! The call runs under the session's runner lease like a turn (two processes never run one
//! session at once), through the AgentService's call pipeline with one slot
//! ([`AgentService::call_direct`](crate::agent::AgentService::call_direct)): the session's
//! grants, loaded tools, policy and budget, journaled as a step of its own. A call the policy
//! asks about waits for a person's decision — taken by `ask` (an MCP client's elicitation)
//! and recorded as a durable approval that the call consumes — or, when nobody can be asked,
//! is refused without running.

use crate::ids::SessionId;
use crate::meta::SessionMeta;
use std::future::Future;

use crate::cancel::CancelToken;
use crate::session::{ApprovalUnit, Decision};
use crate::store::StoreError;

pub use crate::agent::DirectCall;

use super::{Brain, RunnerTasks};

impl Brain {
    /// Runs one direct call of `tool` with `input` (JSON object text) in session `id`. `ask`
    /// is called with the approval unit when the policy asks; it answers with the decision
    /// and its reason, or `None` when nobody can be asked (the call is then refused).
    #[tracing::instrument(name = "direct_call", skip_all, fields(session_id = %id, tool = %tool))]
    pub async fn call_direct<F, Fut>(
        &self,
        id: &SessionId,
        tool: &str,
        input: &str,
        cancel: &CancelToken,
        ask: F,
    ) -> Result<DirectCall, StoreError>
    where
        F: FnOnce(ApprovalUnit) -> Fut,
        Fut: Future<Output = Option<(Decision, Option<String>)>>,
    {
        let busy = || {
            StoreError::Conflict(format!(
                "session `{id}` is being run by another runner; a direct call waits for none"
            ))
        };
        let Some(local) = self.enter(id) else { return Err(busy()) };
        if !self.try_acquire(id).await? {
            return Err(busy());
        }
        let guard = RunnerTasks::start(self, id, cancel);
        let result = match SessionMeta::read(self.engine(), id).await {
            Ok(meta) => self.agent.call_direct(&meta, tool, input, cancel, ask).await,
            Err(e) => Err(e),
        };
        drop(guard);
        let released = self.release(id, true).await;
        drop(local);
        let call = result?;
        released?;
        Ok(call)
    }
}
