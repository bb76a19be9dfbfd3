//! The use case of changing a session after it was created: moving it to another model.

use super::*;
use crate::session::{ModelChange, ModelShown};

impl Harness {
    /// Moves session `id` to another model server, model or context window; its next request
    /// goes there, and a `model_changed` event records the change and who made it. Whoever
    /// may see the session may change its model and window; a new server URL needs an admin,
    /// since the host's model credentials go wherever a session's URL points. Refused while a
    /// turn runs. Returns the model before and after.
    pub async fn set_session_model(
        &self,
        caller: &Caller,
        id: &str,
        change: ModelChange,
    ) -> Result<(ModelShown, ModelShown), ApiError> {
        if change.is_empty() {
            return Err(ApiError::Input(
                "nothing to change: name a model URL, a model or a context window".into(),
            ));
        }
        if change.base_url.is_some() {
            caller.require_admin("moving a session to another model server")?;
        }
        let id = self.checked(caller, id).await?;
        let by = match caller {
            Caller::Operator => crate::session::local_decider(),
            Caller::Api(p) => p.decider(),
        };
        Ok(self.engine.set_model(&id, change, by).await?)
    }
}
