//! Approval units (RuntimeAuditUnits): a blocked call waiting for a person's decision, with
//! everything the decision binds to; how they are read, and the one way a decision is
//! recorded (exactly one wins). How a unit is consumed by the call it binds is the open
//! step's business (`steps.rs`).

use crate::sql::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::ids::{CallId, SessionId, UnitId};
use crate::policy::Effect;
use crate::sandbox::Grant;
use crate::store::{StoreError, now_ms};

crate::stored_enum! {
    /// Where an approval unit stands.
    pub enum ApprovalStatus: "approval status" {
        /// Waiting for a person's decision.
        Pending = "pending",
        /// Approved, not used yet: the call it binds may run once.
        Approved = "approved",
        Rejected = "rejected",
        /// Approved and used by the call it binds.
        Consumed = "consumed",
        /// The tool changed after the decision: the call is asked about again.
        Invalidated = "invalidated",
        /// The turn was closed (interrupted) before the decision was used.
        Cancelled = "cancelled",
    }
}

/// A RuntimeAuditUnit: a blocked call waiting for a person's decision, with everything the
/// decision binds to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalUnit {
    pub id: UnitId,
    pub session_id: SessionId,
    pub step: i64,
    pub call_id: CallId,
    /// The identity its result will have (preallocated when the unit is created).
    pub result_id: String,
    pub tool: String,
    pub effect: Effect,
    /// sha256 of the component that would run.
    pub component_digest: String,
    /// The exact input (JSON text) and its sha256.
    pub input: String,
    pub input_digest: String,
    /// The grants in force: what the call may touch.
    pub grants: Vec<Grant>,
    /// The network grants in force, one line each: where the call may send requests, and the
    /// secrets bound there (names only).
    #[serde(default)]
    pub net: Vec<String>,
    /// Why the policy asks.
    pub why: String,
    pub status: ApprovalStatus,
    pub created_at: i64,
    pub decided_at: Option<i64>,
    pub decision_reason: Option<String>,
    /// Who decided: an API token (`api token NAME`), an MCP client, or the local user.
    pub decided_by: Option<String>,
    pub consumed_at: Option<i64>,
}

impl ApprovalUnit {
    /// Where the unit stands, in words a person reads: `approved by alice at
    /// 2026-12-04T16:40:02.120Z · ran once`.
    pub fn verdict(&self) -> String {
        let by = self.decided_by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
        let at = self
            .decided_at
            .map(|t| format!(" at {}", crate::units::format_time(t)))
            .unwrap_or_default();
        match self.status {
            ApprovalStatus::Pending => "waiting for a decision".to_string(),
            ApprovalStatus::Approved => format!("approved{by}{at} · not run yet"),
            ApprovalStatus::Consumed => format!("approved{by}{at} · ran once"),
            ApprovalStatus::Rejected => format!("rejected{by}{at}"),
            ApprovalStatus::Invalidated => format!(
                "approved{by}{at} · not run: the tool changed before the call ran, so it was asked about again"
            ),
            ApprovalStatus::Cancelled => {
                "cancelled: the turn was closed before the call ran".to_string()
            }
        }
    }

    /// A new pending unit for the call `entry` of step `step` of session `session`, configured
    /// as `config`: what it would run (tool, component, exact input), the grants in force and
    /// why the policy asks. An unresolved call is never asked about, so its effect is known;
    /// the strictest class otherwise.
    pub fn pending(
        session: &crate::ids::SessionId,
        config: &super::SessionConfig,
        step: i64,
        entry: &super::JournalEntry,
        why: String,
    ) -> Self {
        let now = now_ms();
        let seed = format!(
            "{}\u{1f}{step}\u{1f}{}\u{1f}{now}\u{1f}{:?}",
            session,
            entry.call_id,
            std::time::Instant::now()
        );
        let hash = blake3::hash(seed.as_bytes()).to_hex();
        Self {
            id: format!("ap-{}", &hash[..12]).into(),
            session_id: session.clone(),
            step,
            call_id: entry.call_id.clone(),
            result_id: format!("res-{}", &hash[12..24]),
            tool: entry.tool.clone(),
            effect: entry.effect.unwrap_or(Effect::Destructive),
            component_digest: entry.component_digest.clone().unwrap_or_default(),
            input: entry.input.clone(),
            input_digest: crate::digest::sha256_hex(entry.input.as_bytes()),
            grants: config.grants.clone(),
            net: config.net.lines(),
            why,
            status: ApprovalStatus::Pending,
            created_at: now,
            decided_at: None,
            decision_reason: None,
            decided_by: None,
            consumed_at: None,
        }
    }
}

/// A person's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
}

/// Why a decision was not recorded. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("there is no approval `{unit}`; see `keel approvals`")]
    NotFound { unit: UnitId },
    #[error("approval `{unit}` belongs to session `{actual}`, not `{given}`")]
    WrongSession { unit: UnitId, given: SessionId, actual: SessionId },
    #[error("approval `{unit}` is not pending: it is {status}")]
    NotPending { unit: UnitId, status: ApprovalStatus },
}

impl DecideError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::WrongSession { .. } => "wrong_session",
            Self::NotPending { .. } => "not_pending",
        }
    }
}

fn unit_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<(ApprovalUnit, String)> {
    Ok((
        ApprovalUnit {
            id: r.get(0)?,
            session_id: r.get(1)?,
            step: r.get(2)?,
            call_id: r.get(3)?,
            result_id: r.get(4)?,
            tool: r.get(5)?,
            effect: r.get(6)?,
            component_digest: r.get(7)?,
            input: r.get(8)?,
            input_digest: r.get(9)?,
            grants: Vec::new(),
            net: r
                .get::<_, Option<String>>(18)?
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default(),
            why: r.get(11)?,
            status: r.get(12)?,
            created_at: r.get(13)?,
            decided_at: r.get(14)?,
            decision_reason: r.get(15)?,
            consumed_at: r.get(16)?,
            decided_by: r.get(17)?,
        },
        r.get(10)?,
    ))
}

pub(super) const UNIT_COLUMNS: &str = "id, session_id, step, call_id, result_id, tool, effect, component_digest, input, \
     input_digest, grants, why, status, created_at, decided_at, decision_reason, consumed_at, decided_by, net";

pub(super) fn units_where(
    c: &Connection,
    filter: &str,
    args: &[&dyn crate::sql::ToSql],
) -> Result<Vec<ApprovalUnit>, StoreError> {
    let sql =
        format!("SELECT {UNIT_COLUMNS} FROM approvals WHERE {filter} ORDER BY created_at, id");
    let mut stmt = c.prepare_cached(&sql)?;
    let rows = stmt.query_map(args, unit_row)?.collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(mut u, grants)| {
            u.grants = serde_json::from_str(&grants).map_err(|e| {
                StoreError::Corrupt(format!(
                    "stored grants of approval {} are unreadable: {e}",
                    u.id
                ))
            })?;
            Ok(u)
        })
        .collect()
}

/// Approval units of one session (or all), only pending ones when `pending_only`.
pub fn approvals_of(
    c: &Connection,
    session: Option<&str>,
    pending_only: bool,
) -> Result<Vec<ApprovalUnit>, StoreError> {
    let status = if pending_only { "status='pending'" } else { "TRUE" };
    match session {
        Some(s) => units_where(c, &format!("session_id=?1 AND {status}"), &[&s]),
        None => units_where(c, status, &[]),
    }
}

/// One approval unit.
pub fn approval(c: &Connection, unit: &str) -> Result<Option<ApprovalUnit>, StoreError> {
    Ok(units_where(c, "id=?1", &[&unit])?.into_iter().next())
}

/// The owner of the session of approval unit `unit` (`None`: there is no such unit; `Some(None)`:
/// a session created on this machine).
pub(crate) fn owner_of_in(
    c: &Connection,
    unit: &str,
) -> Result<Option<Option<crate::caller::Owner>>, StoreError> {
    let row: Option<Option<String>> = c
        .prepare_cached(
            "SELECT s.owner FROM approvals a JOIN session_config s ON s.session_id = a.session_id
             WHERE a.id=?1",
        )?
        .query_row([unit], |r| r.get(0))
        .optional()?;
    row.map(|owner| owner.map(|o| super::row::parse(&o, "session owner")).transpose()).transpose()
}

/// Records a decision on a pending unit: exactly one decision wins — the update is conditional
/// on the unit still being pending.
pub(crate) fn decide_in(
    c: &Connection,
    unit: &str,
    decision: Decision,
    reason: Option<&str>,
    session: Option<&str>,
    by: &str,
) -> Result<Result<ApprovalUnit, DecideError>, StoreError> {
    let Some(mut u) = approval(c, unit)? else {
        return Ok(Err(DecideError::NotFound { unit: unit.into() }));
    };
    if let Some(given) = session
        && given != u.session_id
    {
        return Ok(Err(DecideError::WrongSession {
            unit: unit.into(),
            given: given.into(),
            actual: u.session_id,
        }));
    }
    let status = match decision {
        Decision::Approve => ApprovalStatus::Approved,
        Decision::Reject => ApprovalStatus::Rejected,
    };
    let now = now_ms();
    let n = c
        .prepare_cached(
            "UPDATE approvals SET status=?2, decided_at=?3, decision_reason=?4, decided_by=?5
             WHERE id=?1 AND status='pending'",
        )?
        .execute(params![unit, status.as_str(), now, reason, by])?;
    if n != 1 {
        return Ok(Err(DecideError::NotPending { unit: unit.into(), status: u.status }));
    }
    super::events::append(
        c,
        &u.session_id,
        &super::events::SessionEvent::ApprovalDecided {
            unit: unit.into(),
            decision: status.as_str().to_string(),
            reason: reason.map(str::to_string),
            by: Some(by.to_string()),
        },
    )?;
    u.status = status;
    u.decided_at = Some(now);
    u.decision_reason = reason.map(str::to_string);
    u.decided_by = Some(by.to_string());
    Ok(Ok(u))
}
