//! The use cases of workgroups: a main session's workgroup, its sessions and the events
//! between them.

use super::*;
use crate::ids::SessionId;

impl Harness {
    /// The main session of the workgroup session `id` belongs to (`None`: a standalone
    /// session).
    pub async fn workgroup_of(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Option<String>, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.brain.workgroup_of(id).await?.map(SessionId::into_string))
    }

    /// The workgroup of main session `main`: its limits, use and sessions.
    pub async fn workgroup(
        &self,
        caller: &Caller,
        main: &str,
    ) -> Result<crate::workgroup::Workgroup, ApiError> {
        let main = &self.checked(caller, main).await?;
        let m = main.to_string();
        let found = self.engine.db().read(move |c| crate::workgroup::workgroup_in(c, &m)).await?;
        match found {
            Some(w) => Ok(w),
            None => {
                self.engine.runtime(main).await?;
                Err(ApiError::Input(format!(
                    "session `{main}` is not a main session; `keel workgroup list` lists them"
                )))
            }
        }
    }

    /// Every workgroup `caller` may see, newest first.
    pub async fn workgroups(
        &self,
        caller: &Caller,
    ) -> Result<Vec<crate::workgroup::Workgroup>, ApiError> {
        let db = self.engine.db().clone();
        let all = db
            .read(|c| {
                let mut out = Vec::new();
                for m in crate::workgroup::mains_in(c)? {
                    out.extend(crate::workgroup::workgroup_in(c, &m)?);
                }
                Ok(out)
            })
            .await?;
        let mut out = Vec::new();
        for w in all {
            if caller.is_admin() || self.sees(caller, &w.main_id).await? {
                out.push(w);
            }
        }
        Ok(out)
    }

    /// The events between the sessions of the workgroup of `main`, in order.
    pub async fn workgroup_events(
        &self,
        caller: &Caller,
        main: &str,
    ) -> Result<Vec<crate::workgroup::EventRecord>, ApiError> {
        self.workgroup(caller, main).await?;
        let m = main.to_string();
        Ok(self.engine.db().read(move |c| crate::workgroup::events_in(c, &m)).await?)
    }

    /// Approval units of session `session` and of every session below it in its workgroup
    /// (`keel approvals --session MAIN --all-children`).
    pub async fn approvals_below(
        &self,
        caller: &Caller,
        session: &str,
        pending_only: bool,
    ) -> Result<Vec<ApprovalUnit>, ApiError> {
        let session = &self.checked(caller, session).await?;
        let s = session.to_string();
        let below = self.engine.db().read(move |c| crate::workgroup::descendants_in(c, &s)).await?;
        let mut out = self.engine.approvals(Some(session), pending_only).await?;
        for d in below {
            out.extend(self.engine.approvals(Some(&d), pending_only).await?);
        }
        Ok(out)
    }
}
